//! Container image references, split into the parts an image overrider changes.
//!
//! ```text
//!  localhost:5000/team/app:v1@sha256:…
//!  └─registry───┘ └repository┘ └tag┘ └digest┘
//! ```
//!
//! The first path component is the registry only when it looks like a host: it contains a
//! `.` or a `:` (a port), or is `localhost`; otherwise the whole name is the repository
//! (`nginx`, `library/nginx`), with no registry implied — an override adding one writes it in
//! front. The tag follows the last `:` after the last `/` (so a registry port is never a
//! tag); a digest follows `@`.
//!
//! Overrides follow Karmada's ImageOverrider: `add` appends the value to the component (for a
//! missing registry or tag, sets it), `replace` sets it, `remove` clears it. Where Karmada
//! silently yields a broken reference, an error is returned instead: removing the repository,
//! adding to a digest, or a component that would not read back as itself (a registry without
//! `.`, `:` or `localhost` would read as part of the repository). Changing the tag drops a
//! digest (the digest would otherwise pin the image and the new tag mean nothing); removing
//! the tag keeps the digest; a `replace` of the Tag component with `algorithm:hex` sets the
//! digest in place of the tag.

use std::fmt;

use meridian_core::placement::{ImageComponent, OverrideOperator};

/// An image reference: `[registry/]repository[:tag][@digest]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageRef {
    pub registry: Option<String>,
    pub repository: String,
    pub tag: Option<String>,
    pub digest: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ImageError {
    #[error("{image:?} is not an image reference: {reason}")]
    Parse { image: String, reason: &'static str },
    #[error("cannot remove the repository of an image")]
    RemoveRepository,
    #[error("cannot add to a digest (the image has no tag)")]
    AddToDigest,
    #[error("{component} {value:?} is not valid: {reason}")]
    Component {
        component: &'static str,
        value: String,
        reason: &'static str,
    },
}

impl ImageRef {
    pub fn parse(image: &str) -> Result<ImageRef, ImageError> {
        let fail = |reason| ImageError::Parse {
            image: image.to_string(),
            reason,
        };
        if image.is_empty() {
            return Err(fail("empty"));
        }
        let (rest, digest) = match image.split_once('@') {
            Some((rest, digest)) => (rest, Some(digest)),
            None => (image, None),
        };
        let last_slash = rest.rfind('/');
        let (name, tag) = match rest.rfind(':') {
            Some(colon) if last_slash.is_none_or(|slash| colon > slash) => {
                (&rest[..colon], Some(&rest[colon + 1..]))
            }
            _ => (rest, None),
        };
        let (registry, repository) = match name.split_once('/') {
            Some((first, path)) if looks_like_registry(first) => (Some(first), path),
            _ => (None, name),
        };
        if let Some(r) = registry {
            check_registry(r).map_err(fail)?;
        }
        check_repository(repository).map_err(fail)?;
        if let Some(t) = tag {
            check_tag(t).map_err(fail)?;
        }
        if let Some(d) = digest {
            check_digest(d).map_err(fail)?;
        }
        Ok(ImageRef {
            registry: registry.map(str::to_string),
            repository: repository.to_string(),
            tag: tag.map(str::to_string),
            digest: digest.map(str::to_string),
        })
    }

    /// Applies one image overrider's component and operator (see the module docs).
    pub fn apply(
        &mut self,
        component: ImageComponent,
        operator: OverrideOperator,
        value: &str,
    ) -> Result<(), ImageError> {
        use OverrideOperator::{Add, Remove, Replace};
        match (component, operator) {
            (ImageComponent::Registry, Add) => {
                let registry = format!("{}{value}", self.registry.as_deref().unwrap_or(""));
                self.registry = Some(valid("registry", registry, check_host)?);
            }
            (ImageComponent::Registry, Replace) => {
                self.registry = Some(valid("registry", value.to_string(), check_host)?);
            }
            (ImageComponent::Registry, Remove) => self.registry = None,
            (ImageComponent::Repository, Add) => {
                let repository = format!("{}{value}", self.repository);
                self.repository = valid("repository", repository, check_repository)?;
            }
            (ImageComponent::Repository, Replace) => {
                self.repository = valid("repository", value.to_string(), check_repository)?;
            }
            (ImageComponent::Repository, Remove) => return Err(ImageError::RemoveRepository),
            (ImageComponent::Tag, Add) => {
                let tag = match (&self.tag, &self.digest) {
                    (Some(tag), _) => format!("{tag}{value}"),
                    (None, Some(_)) => return Err(ImageError::AddToDigest),
                    (None, None) => value.to_string(),
                };
                self.set_tag(valid("tag", tag, check_tag)?);
            }
            (ImageComponent::Tag, Replace) if value.contains(':') => {
                self.digest = Some(valid("digest", value.to_string(), check_digest)?);
                self.tag = None;
            }
            (ImageComponent::Tag, Replace) => {
                self.set_tag(valid("tag", value.to_string(), check_tag)?);
            }
            (ImageComponent::Tag, Remove) => {
                if self.tag.take().is_none() {
                    self.digest = None;
                }
            }
        }
        Ok(())
    }

    fn set_tag(&mut self, tag: String) {
        self.tag = Some(tag);
        self.digest = None;
    }
}

impl fmt::Display for ImageRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(r) = &self.registry {
            write!(f, "{r}/")?;
        }
        f.write_str(&self.repository)?;
        if let Some(t) = &self.tag {
            write!(f, ":{t}")?;
        }
        if let Some(d) = &self.digest {
            write!(f, "@{d}")?;
        }
        Ok(())
    }
}

fn valid(
    component: &'static str,
    value: String,
    check: fn(&str) -> Result<(), &'static str>,
) -> Result<String, ImageError> {
    match check(&value) {
        Ok(()) => Ok(value),
        Err(reason) => Err(ImageError::Component {
            component,
            value,
            reason,
        }),
    }
}

fn looks_like_registry(first: &str) -> bool {
    first.contains(['.', ':']) || first == "localhost"
}

/// A registry an override writes must also read back as one.
fn check_host(registry: &str) -> Result<(), &'static str> {
    if !looks_like_registry(registry) {
        return Err("a registry needs a '.', a ':port' or to be localhost");
    }
    check_registry(registry)
}

/// `host[:port]`: host labels of letters, digits and `-` joined by `.`, or `[ipv6]`.
fn check_registry(registry: &str) -> Result<(), &'static str> {
    let (host, port) = if let Some(v6) = registry.strip_prefix('[') {
        let (addr, after) = v6.split_once(']').ok_or("unclosed '[' in the registry")?;
        if addr.is_empty() || !addr.chars().all(|c| c.is_ascii_hexdigit() || c == ':') {
            return Err("invalid IPv6 registry address");
        }
        match after {
            "" => ("", None),
            p => ("", Some(p.strip_prefix(':').ok_or("junk after ']'")?)),
        }
    } else {
        match registry.split_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (registry, None),
        }
    };
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    if !registry.starts_with('[') && !host.split('.').all(label_ok) {
        return Err("invalid registry host");
    }
    if let Some(p) = port
        && (p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()))
    {
        return Err("invalid registry port");
    }
    Ok(())
}

/// Path components of lowercase letters and digits, joined inside by `.`, `_` or `-`.
fn check_repository(repository: &str) -> Result<(), &'static str> {
    let component_ok = |c: &str| {
        let bytes = c.as_bytes();
        let alnum = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit();
        !bytes.is_empty()
            && bytes.first().is_some_and(alnum)
            && bytes.last().is_some_and(alnum)
            && bytes
                .iter()
                .all(|b| alnum(b) || matches!(b, b'.' | b'_' | b'-'))
    };
    if repository.split('/').all(component_ok) {
        Ok(())
    } else {
        Err("invalid repository (lowercase letters, digits and . _ - inside components)")
    }
}

/// Up to 128 of letters, digits, `_`, `.`, `-`, not starting with `.` or `-`.
fn check_tag(tag: &str) -> Result<(), &'static str> {
    let ok = !tag.is_empty()
        && tag.len() <= 128
        && !tag.starts_with(['.', '-'])
        && tag
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
    if ok { Ok(()) } else { Err("invalid tag") }
}

/// `algorithm:hex`, with at least 32 hex digits (sha256 has 64).
fn check_digest(digest: &str) -> Result<(), &'static str> {
    let (algorithm, hex) = digest.split_once(':').ok_or("a digest is algorithm:hex")?;
    let algorithm_ok = !algorithm.is_empty()
        && algorithm
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"+._-".contains(&b));
    if algorithm_ok && hex.len() >= 32 && hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        Ok(())
    } else {
        Err("invalid digest")
    }
}

#[cfg(test)]
mod tests;
