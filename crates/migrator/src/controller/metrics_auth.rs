//! Who may read `/metrics`: the API server decides, as kube-rbac-proxy and controller-runtime's
//! secure metrics do. roam-controller runs on the host network, so its metrics port is open
//! to anything that reaches a node; the figures name namespaces, networks and failures. A
//! scraper sends a bearer token (a ServiceAccount's); the controller asks the API server who
//! it is (TokenReview) and whether that identity may `get` the non-resource URL `/metrics`
//! (SubjectAccessReview; deploy/ has the ClusterRole `roam-metrics-reader` to bind). The
//! probes (`/healthz`, `/readyz`) stay open: the kubelet sends no token.
//!
//! Answers are kept a short while per token (its SHA-256), so a scrape every few seconds costs
//! the API server two reviews a minute at most.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::Api;
use kube::api::PostParams;

/// The path the reviews ask about.
pub const METRICS_PATH: &str = "/metrics";
/// How long an allowed token is believed.
const ALLOWED_FOR: Duration = Duration::from_secs(60);
/// How long a refused (or unknown) token stays refused.
const REFUSED_FOR: Duration = Duration::from_secs(10);
/// Tokens remembered at once (a scraper or two; more are reviewed each time).
const REMEMBERED: usize = 64;

/// Why a request for `/metrics` is refused: the status and the words.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refused {
    /// 401 (no or unknown token) or 403 (known, not allowed), 503 (the API server did not
    /// answer).
    pub status: u16,
    /// What to do.
    pub message: String,
}

/// The bearer token of an `Authorization` header value (pure).
pub fn bearer(header: Option<&str>) -> Result<&str, Refused> {
    header
        .and_then(|h| h.strip_prefix("Bearer "))
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .ok_or_else(|| Refused {
            status: 401,
            message: "send a ServiceAccount token allowed to get /metrics (bind the \
                      ClusterRole roam-metrics-reader): Authorization: Bearer TOKEN\n"
                .into(),
        })
}

/// The access review of `user` for `get` on `/metrics` (pure).
pub fn access_review(user: &k8s_openapi::api::authentication::v1::UserInfo) -> SubjectAccessReview {
    SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: user.username.clone(),
            uid: user.uid.clone(),
            groups: user.groups.clone(),
            extra: user.extra.clone(),
            non_resource_attributes: Some(NonResourceAttributes {
                path: Some(METRICS_PATH.into()),
                verb: Some("get".into()),
            }),
            ..Default::default()
        },
        ..Default::default()
    }
}

/// How `/metrics` is guarded.
#[derive(Clone)]
pub enum MetricsAuth {
    /// Open to anyone who reaches the port (`--metrics-auth none`).
    Open,
    /// The API server decides (the default).
    Kubernetes {
        /// The controller's client.
        client: kube::Client,
        /// Answers by token digest, until when.
        seen: Arc<Mutex<BTreeMap<String, (bool, Instant)>>>,
    },
}

impl std::fmt::Debug for MetricsAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            MetricsAuth::Open => "Open",
            MetricsAuth::Kubernetes { .. } => "Kubernetes",
        })
    }
}

impl MetricsAuth {
    /// Reviews by the API server behind `client`.
    pub fn kubernetes(client: kube::Client) -> MetricsAuth {
        MetricsAuth::Kubernetes {
            client,
            seen: Arc::default(),
        }
    }

    /// Whether a request with `Authorization: header` may read `/metrics`.
    pub async fn check(&self, header: Option<&str>) -> Result<(), Refused> {
        let MetricsAuth::Kubernetes { client, seen } = self else {
            return Ok(());
        };
        let token = bearer(header)?;
        let key = roam_shim_api::token::TokenDigest::of(token).to_string();
        let now = Instant::now();
        let known = seen
            .lock()
            .expect("metrics auth lock")
            .get(&key)
            .filter(|(_, until)| *until > now)
            .map(|(allowed, _)| *allowed);
        let allowed = match known {
            Some(a) => a,
            None => {
                let a = review(client, token).await?;
                let mut seen = seen.lock().expect("metrics auth lock");
                seen.retain(|_, (_, until)| *until > now);
                if seen.len() < REMEMBERED {
                    let ttl = if a { ALLOWED_FOR } else { REFUSED_FOR };
                    seen.insert(key, (a, now + ttl));
                }
                a
            }
        };
        if allowed {
            Ok(())
        } else {
            Err(Refused {
                status: 403,
                message: "this token may not get /metrics: bind its ServiceAccount to the \
                          ClusterRole roam-metrics-reader\n"
                    .into(),
            })
        }
    }
}

/// Ask the API server whether `token` is someone allowed to get `/metrics`.
async fn review(client: &kube::Client, token: &str) -> Result<bool, Refused> {
    let unavailable = |e: kube::Error| Refused {
        status: 503,
        message: format!("the API server did not review the token: {e}\n"),
    };
    let tr = TokenReview {
        spec: TokenReviewSpec {
            token: Some(token.to_string()),
            ..Default::default()
        },
        ..Default::default()
    };
    let tr = Api::<TokenReview>::all(client.clone())
        .create(&PostParams::default(), &tr)
        .await
        .map_err(unavailable)?;
    let Some(user) = tr
        .status
        .filter(|s| s.authenticated == Some(true))
        .and_then(|s| s.user)
    else {
        return Err(Refused {
            status: 401,
            message: "the API server does not know this token: send a ServiceAccount's token\n"
                .into(),
        });
    };
    let sar = Api::<SubjectAccessReview>::all(client.clone())
        .create(&PostParams::default(), &access_review(&user))
        .await
        .map_err(unavailable)?;
    Ok(sar.status.is_some_and(|s| s.allowed))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_bearer_token_is_taken() {
        assert_eq!(bearer(Some("Bearer abc")), Ok("abc"));
        assert_eq!(bearer(Some("Bearer  abc ")), Ok("abc"));
        for h in [
            None,
            Some(""),
            Some("Bearer "),
            Some("Basic abc"),
            Some("bearer abc"),
        ] {
            let e = bearer(h).unwrap_err();
            assert_eq!(e.status, 401, "{h:?}");
            assert!(e.message.contains("roam-metrics-reader"), "{}", e.message);
        }
    }

    #[test]
    fn the_review_asks_for_get_on_metrics_as_the_tokens_user() {
        let user = k8s_openapi::api::authentication::v1::UserInfo {
            username: Some("system:serviceaccount:mon:prometheus".into()),
            uid: Some("u1".into()),
            groups: Some(vec!["system:serviceaccounts".into()]),
            extra: None,
        };
        let sar = access_review(&user);
        assert_eq!(sar.spec.user, user.username);
        assert_eq!(sar.spec.uid, user.uid);
        assert_eq!(sar.spec.groups, user.groups);
        let n = sar.spec.non_resource_attributes.unwrap();
        assert_eq!(
            (n.path.as_deref(), n.verb.as_deref()),
            (Some("/metrics"), Some("get"))
        );
        assert!(sar.spec.resource_attributes.is_none());
    }
}
