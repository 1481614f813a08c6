//! What several fuzz targets share.

/// Sets limit `name` to `value` once per process, so an execution stays cheap: sizes above
/// it are refused by the same checks that refuse bombs at the default limit.
pub fn limit(name: &str, value: u64) {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        chute_core::Limits::default()
            .with(name, value)
            .expect("a valid limit")
            .install();
    });
}
