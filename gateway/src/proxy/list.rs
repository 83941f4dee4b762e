//! A LIST through `*`: every member's list as one, read a page at a time.
//!
//! ```text
//!  no limit ─► each member's first page, a few entries (HELD_BEFORE_HEAD over the fleet),
//!              MEMBERS_AT_ONCE at a time ─► the head: 200, a Warning per member left out,
//!              the composite resourceVersion
//!           ─► the body, streamed: member by member in name order, pages of MEMBER_PAGE
//!              following each member's own continue token, MEMBERS_AT_ONCE members ahead
//!  limit, or continue ─► members in name order from the token's until `limit` entries, one
//!              body; the token names the list, the gateway holds its versions (`continues`)
//! ```
//!
//! Memory: an unpaged list holds the first pages' few entries and, while it streams, a page
//! for each member fetched ahead — not the fleet's list. Entries are copied with their mark,
//! never parsed into a tree (`merge::page`).
//!
//! A member that fails before the head goes out is left out and named in a Warning, as
//! always. One that fails after (its later page: the member went away, or its token expired)
//! cannot be named in a header any more, and its objects are not all there: the body ends with
//! an error (an HTTP/2 stream reset, or a chunked body cut short), so the client's read fails
//! and it lists again, rather than taking an incomplete list for the fleet's.
//! `meridian_gateway_lists_cut` counts these, by member. Asking every member first, with a
//! small page, keeps that window short: the common failures (down, refused, unreachable)
//! happen before the head.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use axum::body::Body;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures::stream::{self, Stream, StreamExt};
use http::StatusCode;
use http::header::{self, HeaderValue};
use kube::Client;
use tracing::Instrument;

use super::fanout::{LeftOut, requested_version};
use super::forward::{SendError, send};
use super::state::{Call, Member, Shared, failure};
use crate::continues::ResumeError;
use crate::merge::page::{self, Joiner, Page};
use crate::merge::{Composite, Continue};
use crate::metrics::ClusterLabels;
use crate::path::{query_param, with_params};

/// The page size the gateway asks members for when it pages them itself (the client's
/// pager's default).
pub(crate) const MEMBER_PAGE: usize = 500;
/// Entries an unpaged list holds over the whole fleet before its head goes out: each
/// member's first page is this divided by the members (at most MEMBER_PAGE, at least one).
const HELD_BEFORE_HEAD: usize = 10_000;
/// Members asked at once (their first pages; their later pages, fetched ahead).
pub(crate) const MEMBERS_AT_ONCE: usize = 32;

/// The union of every member's list: streamed whole, or paged by `limit` and `continue`.
pub(crate) async fn list(shared: &Arc<Shared>, path: &str, call: &Call) -> Response {
    let (requested, composite) = match requested_version(path, &shared.rosters) {
        Ok(v) => v,
        Err(refused) => return *refused,
    };
    let lister = Arc::new(Lister {
        shared: shared.clone(),
        call: call.clone(),
        path: path.to_string(),
        requested: requested.map(str::to_string),
        composite,
    });
    let members = shared.members_for(call, path);
    let limit = query_param(path, "limit")
        .and_then(|l| l.parse::<usize>().ok())
        .filter(|l| *l > 0);
    let token = query_param(path, "continue").filter(|c| !c.is_empty());
    match (limit, token) {
        (None, None) => streamed(lister, members).await,
        (limit, token) => paged(&lister, &members, limit.unwrap_or(MEMBER_PAGE), token).await,
    }
}

/// What a list request asks of each member, and how it reads their pages.
struct Lister {
    shared: Arc<Shared>,
    call: Call,
    path: String,
    /// The client's `resourceVersion`, and the composite it is, if it is one.
    requested: Option<String>,
    composite: Option<Composite>,
}

/// Why a member's page is missing.
enum Failed {
    /// The member answered 410 (the version asked is compacted): the whole answer's.
    Gone(Bytes),
    /// Anything else: the member is left out (or, once the head went out, the list is cut).
    Member(String),
}

impl Lister {
    /// `cluster`'s page of at most `limit` entries: its first (at the version the client
    /// asked), or the one its own `token` continues (at that token's version).
    fn member_path(&self, cluster: &str, limit: usize, token: Option<&str>) -> String {
        let limit = limit.to_string();
        let version = match token {
            Some(_) => None,
            None => Composite::for_member(self.requested.as_deref(), &self.composite, cluster),
        };
        with_params(
            &self.path,
            &[
                ("resourceVersion", version),
                ("limit", Some(&limit)),
                ("continue", token),
            ],
        )
    }

    async fn page(
        &self,
        cluster: &str,
        client: &Client,
        limit: usize,
        token: Option<&str>,
    ) -> Result<Page, Failed> {
        let path = self.member_path(cluster, limit, token);
        let timeout = self.shared.config.member_timeout;
        let response = send(client, cluster, &path, &self.call, Some(timeout))
            .await
            .map_err(|e| Failed::Member(e.describe()))?;
        let status = response.status();
        let bytes = tokio::time::timeout(timeout, response.into_body().collect_bytes())
            .await
            .map_err(|_| Failed::Member(SendError::Timeout(timeout).describe()))?
            .map_err(|e| Failed::Member(e.to_string()))?;
        if status == StatusCode::GONE {
            return Err(Failed::Gone(bytes));
        }
        if !status.is_success() {
            return Err(Failed::Member(refusal(status, &bytes)));
        }
        page::read(&bytes, cluster, |entry| {
            self.call.shows_entry(cluster, &self.path, entry)
        })
        .map_err(|e| Failed::Member(format!("the answer is not a list: {e}")))
    }
}

/// A member's refusal as the reason it is left out: its code and its Status's message.
fn refusal(status: StatusCode, body: &[u8]) -> String {
    let message = serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|b| b["message"].as_str().map(str::to_string))
        .unwrap_or_else(|| "(no message)".into());
    format!("{} {message}", status.as_u16())
}

/// A member's 410, as the whole answer (the client lists again).
fn gone(body: Bytes) -> Response {
    (
        StatusCode::GONE,
        [(header::CONTENT_TYPE, "application/json")],
        body,
    )
        .into_response()
}

fn expired(why: &ResumeError) -> Response {
    failure(StatusCode::GONE, "Expired", &why.to_string())
}

/// The ready members (the others go to `left_out`).
fn ready(
    shared: &Shared,
    members: Vec<(String, Member)>,
    left_out: &mut LeftOut,
) -> Vec<(String, Client)> {
    members
        .into_iter()
        .filter_map(|(name, m)| match m {
            Member::Ready(client) => Some((name, client)),
            Member::Down(why) => {
                left_out.add(shared, &name, why);
                None
            }
        })
        .collect()
}

/// A member whose first page is in.
struct Listed {
    cluster: String,
    client: Client,
    page: Page,
}

/// How many entries each member's first page asks for, so the fleet's first pages hold
/// about HELD_BEFORE_HEAD entries.
fn first_page(members: usize) -> usize {
    (HELD_BEFORE_HEAD / members.max(1)).clamp(1, MEMBER_PAGE)
}

/// An unpaged list: the first pages, then the head, then the body as the pages come.
async fn streamed(lister: Arc<Lister>, members: Vec<(String, Member)>) -> Response {
    let shared = &lister.shared;
    let mut left_out = LeftOut::default();
    let ready = ready(shared, members, &mut left_out);
    let limit = first_page(ready.len());
    let firsts: Vec<(String, Client, Result<Page, Failed>)> = stream::iter(ready)
        .map(|(cluster, client)| {
            let lister = lister.clone();
            async move {
                let page = lister.page(&cluster, &client, limit, None).await;
                (cluster, client, page)
            }
        })
        .buffered(MEMBERS_AT_ONCE)
        .collect()
        .await;
    let mut composite = Composite::default();
    let mut listed = Vec::new();
    for (cluster, client, page) in firsts {
        match page {
            Ok(page) => {
                if let Some(rv) = &page.resource_version {
                    composite.set(&cluster, rv);
                }
                listed.push(Listed {
                    cluster,
                    client,
                    page,
                });
            }
            Err(Failed::Gone(body)) => return gone(body),
            Err(Failed::Member(why)) => left_out.add(shared, &cluster, why),
        }
    }
    let head = page::open(
        listed.first().map(|l| &l.page),
        &composite.encode(&shared.roster()),
        None,
    );
    let body = stream::once(async move { Ok(Bytes::from(head)) })
        .chain(entries(lister.clone(), listed))
        .chain(stream::once(async { Ok(Bytes::from_static(page::CLOSE)) }));
    let mut response = Response::new(Body::from_stream(until_error(body)));
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    left_out.warn(&mut response);
    response
}

/// A member failed after the head went out.
struct Cut {
    cluster: String,
    why: String,
}

/// The entries of every listed member, in order: each member's first page, then its later
/// pages; members ahead of the one being written fetch their second page meanwhile.
fn entries(
    lister: Arc<Lister>,
    listed: Vec<Listed>,
) -> impl Stream<Item = Result<Bytes, std::io::Error>> + Send {
    let fetcher = lister.clone();
    let ahead = stream::iter(listed)
        .map(move |l| {
            let lister = fetcher.clone();
            let cluster = l.cluster.clone();
            let fetch = Spawned(tokio::spawn(
                async move {
                    let second = match &l.page.continue_token {
                        Some(token) => Some(
                            lister
                                .page(&l.cluster, &l.client, MEMBER_PAGE, Some(token))
                                .await,
                        ),
                        None => None,
                    };
                    (l, second)
                }
                .in_current_span(),
            ));
            async move { (cluster, fetch.await) }
        })
        .buffered(MEMBERS_AT_ONCE);
    let pager = lister.clone();
    ahead
        .flat_map(move |(cluster, fetched)| match fetched {
            Ok((l, second)) => pages(pager.clone(), l, second).boxed(),
            Err(e) => stream::once(async move {
                Err(Cut {
                    cluster,
                    why: format!("its fetch ended: {e}"),
                })
            })
            .boxed(),
        })
        .scan(Joiner::default(), move |joiner, page| {
            let chunk = match page {
                Ok(page) => Ok(joiner.next(page)),
                Err(cut) => Err(cut_short(&lister.shared, cut)),
            };
            async move { Some(chunk) }
        })
        .filter(|chunk| {
            let empty = chunk.as_ref().is_ok_and(Bytes::is_empty);
            async move { !empty }
        })
}

/// What comes after a member's page: its next page, fetched, or its end.
enum Next {
    Have(Result<Page, Failed>),
    Fetch(String),
    End,
}

/// One member's pages: the first (already in), the second (fetched ahead), then each after.
fn pages(
    lister: Arc<Lister>,
    listed: Listed,
    second: Option<Result<Page, Failed>>,
) -> impl Stream<Item = Result<Page, Cut>> + Send {
    let Listed {
        cluster,
        client,
        mut page,
    } = listed;
    // The first page's token went to fetch the second.
    page.continue_token = None;
    let next = second.map_or(Next::End, Next::Have);
    let rest = stream::unfold(
        (next, lister, cluster, client),
        |(next, lister, cluster, client)| async move {
            let got = match next {
                Next::End => return None,
                Next::Have(got) => got,
                Next::Fetch(token) => {
                    lister
                        .page(&cluster, &client, MEMBER_PAGE, Some(&token))
                        .await
                }
            };
            let (item, next) = match got {
                Ok(mut page) => {
                    let next = page.continue_token.take().map_or(Next::End, Next::Fetch);
                    (Ok(page), next)
                }
                Err(Failed::Gone(_)) => (
                    Err(Cut {
                        cluster: cluster.clone(),
                        why: "its continue token expired (410)".into(),
                    }),
                    Next::End,
                ),
                Err(Failed::Member(why)) => (
                    Err(Cut {
                        cluster: cluster.clone(),
                        why,
                    }),
                    Next::End,
                ),
            };
            Some((item, (next, lister, cluster, client)))
        },
    );
    stream::once(async move { Ok(page) }).chain(rest)
}

/// A list cut short: counted, shown, and the body's error.
fn cut_short(shared: &Shared, cut: Cut) -> std::io::Error {
    shared
        .metrics
        .lists_cut
        .get_or_create(&ClusterLabels {
            cluster: cut.cluster.clone(),
        })
        .inc();
    let message = format!(
        "{} failed after the list's head was sent ({}): the list is cut short",
        cut.cluster, cut.why
    );
    tracing::warn!(cluster = %cut.cluster, why = %cut.why, "a list through * cut short");
    shared.view.problem("every", &cut.cluster, 502, &message);
    std::io::Error::other(message)
}

/// `body` up to and with its first error: nothing after it (the closing bracket least of all).
fn until_error<S>(body: S) -> impl Stream<Item = Result<Bytes, std::io::Error>> + Send
where
    S: Stream<Item = Result<Bytes, std::io::Error>> + Send,
{
    body.scan(false, |failed, chunk| {
        let out = (!*failed).then(|| {
            *failed = chunk.is_err();
            chunk
        });
        async move { out }
    })
}

/// A paged list: members in name order from the token's, until `limit` entries.
async fn paged(
    lister: &Lister,
    members: &[(String, Member)],
    limit: usize,
    token: Option<&str>,
) -> Response {
    let shared = &lister.shared;
    let collection = lister.path.split('?').next().unwrap_or_default();
    let now = Instant::now();
    let (resume, mut composite) = match token.map(|t| resume_from(shared, t, collection, now)) {
        None => (None, Composite::default()),
        Some(Ok((token, done))) => (Some(token), done),
        Some(Err(response)) => return *response,
    };
    let start = resume.as_ref().map_or("", |c| c.cluster.as_str());
    let mut left_out = LeftOut::default();
    let mut remaining = limit;
    let mut pages = Vec::new();
    let mut next = None;
    for (cluster, member) in members.iter().filter(|(n, _)| n.as_str() >= start) {
        if remaining == 0 {
            next = Some((cluster.clone(), String::new()));
            break;
        }
        let client = match member {
            Member::Ready(client) => client,
            Member::Down(why) => {
                left_out.add(shared, cluster, why.clone());
                continue;
            }
        };
        let own = resume
            .as_ref()
            .filter(|c| c.cluster == *cluster && !c.member.is_empty())
            .map(|c| c.member.as_str());
        match lister.page(cluster, client, remaining, own).await {
            Err(Failed::Gone(body)) => return gone(body),
            Err(Failed::Member(why)) => left_out.add(shared, cluster, why),
            Ok(mut page) => {
                remaining = remaining.saturating_sub(page.sent);
                if let Some(rv) = &page.resource_version {
                    composite.set(cluster, rv);
                }
                let more = page.continue_token.take();
                pages.push(page);
                if let Some(more) = more {
                    next = Some((cluster.clone(), more));
                    break;
                }
            }
        }
    }
    let continue_token = match next {
        None => None,
        Some((cluster, member)) => {
            let list = resume.as_ref().map(|c| c.list.as_str());
            match shared.lists.record(list, collection, &composite, now) {
                Ok(list) => Some(
                    Continue {
                        list,
                        cluster,
                        member,
                    }
                    .encode(),
                ),
                Err(e) => {
                    return failure(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "InternalError",
                        &e.to_string(),
                    );
                }
            }
        }
    };
    let mut body = page::open(
        pages.first(),
        &composite.encode(&shared.roster()),
        continue_token.as_deref(),
    );
    let mut joiner = Joiner::default();
    for page in pages {
        body.extend_from_slice(&joiner.next(page));
    }
    body.extend_from_slice(page::CLOSE);
    let mut response = (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        body,
    )
        .into_response();
    left_out.warn(&mut response);
    response
}

/// The token a paged list goes on from, and the versions of the members it had done; or the
/// answer when it cannot go on (400 for a token not the gateway's, 410 for a list gone).
fn resume_from(
    shared: &Shared,
    token: &str,
    collection: &str,
    now: Instant,
) -> Result<(Continue, Composite), Box<Response>> {
    if Continue::is_old(token) {
        return Err(Box::new(expired(&ResumeError::Expired)));
    }
    let token = Continue::decode(token).map_err(|e| {
        Box::new(failure(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            &e.to_string(),
        ))
    })?;
    match shared.lists.resume(&token, collection, now) {
        Ok(done) => Ok((token, done)),
        Err(e @ ResumeError::Expired) => Err(Box::new(expired(&e))),
        Err(e) => Err(Box::new(failure(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            &e.to_string(),
        ))),
    }
}

/// A spawned task, aborted when dropped: a client that goes away stops the members' fetches
/// done ahead for it.
struct Spawned<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for Spawned<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl<T> Future for Spawned<T> {
    type Output = Result<T, tokio::task::JoinError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.0).poll(cx)
    }
}
