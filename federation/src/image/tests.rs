use meridian_core::placement::ImageComponent::{Registry, Repository, Tag};
use meridian_core::placement::OverrideOperator::{Add, Remove, Replace};

use super::*;

const SHA: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

fn img(
    registry: Option<&str>,
    repository: &str,
    tag: Option<&str>,
    digest: Option<&str>,
) -> ImageRef {
    ImageRef {
        registry: registry.map(str::to_string),
        repository: repository.to_string(),
        tag: tag.map(str::to_string),
        digest: digest.map(str::to_string),
    }
}

#[test]
fn parse_table() {
    let pinned = format!("registry.k8s.io/pause@{SHA}");
    let both = format!("nginx:1.25@{SHA}");
    let cases: Vec<(&str, &str, ImageRef)> = vec![
        ("bare name", "nginx", img(None, "nginx", None, None)),
        (
            "name and tag",
            "nginx:1.25",
            img(None, "nginx", Some("1.25"), None),
        ),
        (
            "docker hub path is not a registry",
            "library/nginx",
            img(None, "library/nginx", None, None),
        ),
        (
            "docker hub spelled out",
            "docker.io/library/nginx:1.25",
            img(Some("docker.io"), "library/nginx", Some("1.25"), None),
        ),
        (
            "registry port is not a tag",
            "localhost:5000/app:v1",
            img(Some("localhost:5000"), "app", Some("v1"), None),
        ),
        (
            "registry port without a tag",
            "registry.example.com:443/team/app",
            img(Some("registry.example.com:443"), "team/app", None, None),
        ),
        (
            "localhost alone",
            "localhost/app",
            img(Some("localhost"), "app", None, None),
        ),
        (
            "digest",
            &pinned,
            img(Some("registry.k8s.io"), "pause", None, Some(SHA)),
        ),
        (
            "tag and digest",
            &both,
            img(None, "nginx", Some("1.25"), Some(SHA)),
        ),
        (
            "ipv6 registry",
            "[::1]:5000/app:v1",
            img(Some("[::1]:5000"), "app", Some("v1"), None),
        ),
        (
            "deep path",
            "ghcr.io/org/team/app_x-y.z:v1.2.3-rc.1",
            img(
                Some("ghcr.io"),
                "org/team/app_x-y.z",
                Some("v1.2.3-rc.1"),
                None,
            ),
        ),
    ];
    for (name, input, expect) in cases {
        let got = ImageRef::parse(input).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(got, expect, "{name}");
        assert_eq!(got.to_string(), input, "{name}: round trip");
    }
}

#[test]
fn parse_rejects() {
    for (name, input) in [
        ("empty", ""),
        ("uppercase repository", "Nginx"),
        ("empty tag", "nginx:"),
        ("bad tag", "nginx:.1"),
        ("space", "nginx latest"),
        ("short digest", "nginx@sha256:abc"),
        (
            "digest without algorithm",
            "nginx@0123456789abcdef0123456789abcdef",
        ),
        ("empty path component", "example.com//app"),
        ("bad port", "example.com:x/app"),
        ("empty repository after registry", "example.com/"),
    ] {
        assert!(ImageRef::parse(input).is_err(), "{name}: {input:?} parsed");
    }
}

struct Case {
    name: &'static str,
    image: String,
    component: ImageComponent,
    operator: OverrideOperator,
    value: &'static str,
    expect: Result<String, ()>,
}

fn case(
    name: &'static str,
    image: &str,
    component: ImageComponent,
    operator: OverrideOperator,
    value: &'static str,
    expect: Result<&str, ()>,
) -> Case {
    Case {
        name,
        image: image.to_string(),
        component,
        operator,
        value,
        expect: expect.map(str::to_string),
    }
}

#[test]
fn override_table() {
    let pinned = format!("registry.k8s.io/pause@{SHA}");
    let both = format!("nginx:1.25@{SHA}");
    let both_no_tag = format!("nginx@{SHA}");
    let mirror_pinned = format!("mirror.example.com/pause@{SHA}");
    let cases = [
        // Registry
        case(
            "registry add to none",
            "nginx:1.25",
            Registry,
            Add,
            "mirror.example.com",
            Ok("mirror.example.com/nginx:1.25"),
        ),
        case(
            "registry add appends",
            "registry.k8s.io/pause:3.9",
            Registry,
            Add,
            ".cn",
            Ok("registry.k8s.io.cn/pause:3.9"),
        ),
        case(
            "registry add a port",
            "example.com/app",
            Registry,
            Add,
            ":5000",
            Ok("example.com:5000/app"),
        ),
        case(
            "registry replace",
            "docker.io/library/nginx:1.25",
            Registry,
            Replace,
            "mirror.example.com",
            Ok("mirror.example.com/library/nginx:1.25"),
        ),
        case(
            "registry replace keeps the digest",
            &pinned,
            Registry,
            Replace,
            "mirror.example.com",
            Ok(&mirror_pinned),
        ),
        case(
            "registry replace with a port",
            "localhost:5000/app:v1",
            Registry,
            Replace,
            "registry.local:443",
            Ok("registry.local:443/app:v1"),
        ),
        case(
            "registry replace to localhost",
            "nginx",
            Registry,
            Replace,
            "localhost",
            Ok("localhost/nginx"),
        ),
        case(
            "registry remove",
            "localhost:5000/app:v1",
            Registry,
            Remove,
            "",
            Ok("app:v1"),
        ),
        case(
            "registry remove when none",
            "nginx",
            Registry,
            Remove,
            "",
            Ok("nginx"),
        ),
        case(
            "registry that would read as a path",
            "nginx",
            Registry,
            Replace,
            "mirror",
            Err(()),
        ),
        case(
            "registry with a slash",
            "nginx",
            Registry,
            Replace,
            "a.com/b",
            Err(()),
        ),
        // Repository
        case(
            "repository add appends",
            "docker.io/library/nginx:1.25",
            Repository,
            Add,
            "-debug",
            Ok("docker.io/library/nginx-debug:1.25"),
        ),
        case(
            "repository replace",
            "localhost:5000/app:v1",
            Repository,
            Replace,
            "team/other",
            Ok("localhost:5000/team/other:v1"),
        ),
        case(
            "repository replace keeps the digest",
            &pinned,
            Repository,
            Replace,
            "pause-amd64",
            Ok(&format!("registry.k8s.io/pause-amd64@{SHA}")),
        ),
        case(
            "repository remove is refused",
            "nginx",
            Repository,
            Remove,
            "",
            Err(()),
        ),
        case(
            "repository uppercase refused",
            "nginx",
            Repository,
            Replace,
            "Nginx",
            Err(()),
        ),
        // Tag
        case(
            "tag add appends",
            "nginx:1.25",
            Tag,
            Add,
            "-alpine",
            Ok("nginx:1.25-alpine"),
        ),
        case(
            "tag add to none sets it",
            "localhost:5000/app",
            Tag,
            Add,
            "v2",
            Ok("localhost:5000/app:v2"),
        ),
        case(
            "tag add to a digest is refused",
            &pinned,
            Tag,
            Add,
            "v2",
            Err(()),
        ),
        case(
            "tag add drops the digest",
            &both,
            Tag,
            Add,
            "-alpine",
            Ok("nginx:1.25-alpine"),
        ),
        case(
            "tag replace",
            "localhost:5000/app:v1",
            Tag,
            Replace,
            "v2",
            Ok("localhost:5000/app:v2"),
        ),
        case(
            "tag replace on a digest",
            &pinned,
            Tag,
            Replace,
            "3.9",
            Ok("registry.k8s.io/pause:3.9"),
        ),
        case(
            "tag replace with a digest",
            "nginx:1.25",
            Tag,
            Replace,
            SHA,
            Ok(&both_no_tag),
        ),
        case(
            "tag replace invalid",
            "nginx:1.25",
            Tag,
            Replace,
            "bad tag",
            Err(()),
        ),
        case(
            "tag replace with a bad digest",
            "nginx:1.25",
            Tag,
            Replace,
            "sha256:xyz",
            Err(()),
        ),
        case(
            "tag remove",
            "localhost:5000/app:v1",
            Tag,
            Remove,
            "",
            Ok("localhost:5000/app"),
        ),
        case(
            "tag remove keeps the digest",
            &both,
            Tag,
            Remove,
            "",
            Ok(&both_no_tag),
        ),
        case(
            "tag remove on a digest removes it",
            &pinned,
            Tag,
            Remove,
            "",
            Ok("registry.k8s.io/pause"),
        ),
        case(
            "tag remove when none",
            "nginx",
            Tag,
            Remove,
            "",
            Ok("nginx"),
        ),
    ];
    for c in cases {
        let mut image = ImageRef::parse(&c.image).unwrap();
        let before = image.clone();
        let got = image.apply(c.component, c.operator, c.value);
        match (&got, &c.expect) {
            (Ok(()), Ok(expect)) => assert_eq!(&image.to_string(), expect, "{}", c.name),
            (Err(_), Err(())) => assert_eq!(image, before, "{}: changed on error", c.name),
            _ => panic!(
                "{}: got {got:?} and {image}, expected {:?}",
                c.name, c.expect
            ),
        }
        if got.is_ok() {
            let reparsed = ImageRef::parse(&image.to_string()).unwrap();
            assert_eq!(reparsed, image, "{}: result reads back as itself", c.name);
        }
    }
}
