//! Placeholder until the template summary lands (merge takes the real module).

use meridian_core::placement::Template;

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct TemplateError(String);

pub fn summarize(body: serde_json::Value) -> Result<Template, TemplateError> {
    let _ = body;
    todo!("template summary")
}
