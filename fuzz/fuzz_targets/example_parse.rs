//! `tf.train.Example` decoding: never panics, and whatever decodes re-encodes to itself and
//! converts to the sample that encodes to the same bytes.

#![no_main]

use bytes::Bytes;
use chute_formats::example::{
    Example, ExampleOptions, Feature, example_to_sample, sample_to_example,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let bytes = Bytes::copy_from_slice(data);
    let decoded = Example::decode(&bytes, "fuzz");
    let sample = example_to_sample(0, String::new(), bytes, &ExampleOptions::default());
    let Ok(example) = decoded else {
        assert!(
            sample.is_err(),
            "the sample path accepted what the decoder refused"
        );
        return;
    };
    // Deterministic, and a fixed point: encode(decode(encode(x))) == encode(x).
    let encoded = example.encode();
    let again = Example::decode(&Bytes::from(encoded.clone()), "re-encoded")
        .expect("chute's own encoding decodes");
    assert_eq!(again.encode(), encoded);
    match sample {
        // The sample holds the same features, so it encodes to the same bytes.
        Ok(sample) => assert_eq!(sample_to_example(&sample).unwrap(), encoded),
        // The only thing the sample path refuses beyond the decoder: byte lists of other than
        // one value.
        Err(_) => assert!(
            example
                .features()
                .iter()
                .any(|(_, f)| matches!(f, Feature::Bytes(v) if v.len() != 1)),
            "the sample path refused a decodable example without a multi-value bytes_list"
        ),
    }
});
