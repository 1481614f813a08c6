//! What several fuzz targets share.

/// Images of at most 2^16 pixels (`max_image_pixels`, which bounds decodes and op outputs
/// alike), so an execution stays cheap; larger declared sizes are refused by the same check.
pub fn small_images() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        chute_core::Limits::default()
            .with("max_image_pixels", 1 << 16)
            .expect("a valid limit")
            .install();
    });
}
