//! Kubernetes `Status` errors: every refusal a simulated member makes is one of these, in the
//! JSON form clients parse (`kube::Error::Api`).

use serde_json::{Value, json};

use crate::resources::ResourceType;

/// A refusal with its HTTP code and Kubernetes reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code} {reason}: {message}")]
pub struct ApiError {
    pub code: u16,
    /// `NotFound`, `AlreadyExists`, `Conflict`, `Expired`, `BadRequest`, …
    pub reason: &'static str,
    pub message: String,
    /// (group, kind, name) for `details`.
    pub details: Option<(String, String, String)>,
}

pub type Result<T, E = ApiError> = std::result::Result<T, E>;

impl ApiError {
    pub fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            code,
            reason,
            message: message.into(),
            details: None,
        }
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    fn about(mut self, t: &ResourceType, name: &str) -> Self {
        self.details = Some((t.group.clone(), t.resource.clone(), name.to_owned()));
        self
    }

    /// `deployments.apps "web" not found`.
    pub fn not_found(t: &ResourceType, name: &str) -> Self {
        Self::new(
            404,
            "NotFound",
            format!("{} \"{name}\" not found", t.display()),
        )
        .about(t, name)
    }

    pub fn namespace_not_found(namespace: &str) -> Self {
        Self::new(
            404,
            "NotFound",
            format!("namespaces \"{namespace}\" not found"),
        )
    }

    pub fn already_exists(t: &ResourceType, name: &str) -> Self {
        Self::new(
            409,
            "AlreadyExists",
            format!("{} \"{name}\" already exists", t.display()),
        )
        .about(t, name)
    }

    /// A write against an older resourceVersion (or a failed delete precondition).
    pub fn stale(t: &ResourceType, name: &str, why: &str) -> Self {
        Self::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{name}\": {why}",
                t.display()
            ),
        )
        .about(t, name)
    }

    /// A watch or list from a resourceVersion older than the member keeps.
    pub fn expired(rv: u64, oldest: u64) -> Self {
        Self::new(
            410,
            "Expired",
            format!("too old resource version: {rv} ({oldest})"),
        )
    }

    pub fn unauthorized() -> Self {
        Self::new(401, "Unauthorized", "Unauthorized")
    }

    pub fn method_not_allowed(method: &str, path: &str) -> Self {
        Self::new(
            405,
            "MethodNotAllowed",
            format!(
                "the server does not allow this method on the requested resource: {method} {path}"
            ),
        )
    }

    /// The `Status` object.
    pub fn to_json(&self) -> Value {
        let mut out = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if let Some((group, kind, name)) = &self.details {
            out["details"] = json!({"name": name, "group": group, "kind": kind});
        }
        out
    }
}
