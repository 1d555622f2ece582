//! How the S3 store reaches its bucket: the settings a server is given ([`S3Config`]), merged
//! with the `AWS_*` environment variables, and the clients made from them (for reads, for
//! sends, and for a collection's deletes: their timeouts and retries differ).

use std::time::Duration;

use object_store::aws::{AmazonS3, AmazonS3Builder, AmazonS3ConfigKey};
use object_store::path::Path as Key;
use object_store::{ClientConfigKey, RetryConfig};

use super::super::StoreError;

/// Opening a connection.
const CONNECT_TIMEOUT: &str = "5s";
/// A read's request, up to its answer's headers; then each read of its body.
const READ_TIMEOUT: &str = "30s";
/// A read's whole request, body included: a large blob may take long to reach a slow client,
/// which each read's bound already watches; this only ends what would never end.
const READ_TOTAL: &str = "24h";
/// A send's whole request, body included: one part of up to [`super::PART`] bytes must go
/// in this time (8 MiB in 5 minutes: at least 0.22 Mbit/s).
const SEND_TIMEOUT: &str = "300s";
/// A collection's delete, whole.
const REMOVAL_TIMEOUT: &str = "30s";

/// The clients of one bucket.
pub(super) struct Clients {
    pub reads: AmazonS3,
    pub sends: AmazonS3,
    /// For a collection's deletes: never retried, since a retry of a delete whose answer was
    /// lost could remove a copy uploaded since the first one removed the blob
    /// (`s3/collect.rs`).
    pub removals: AmazonS3,
}

/// Which bucket, and how to reach it. What is left `None` comes from the `AWS_*` environment
/// variables that the `object_store` crate reads (`AWS_ENDPOINT_URL`, `AWS_REGION`,
/// `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`, web identity, the
/// instance metadata service; not `~/.aws` profiles or SSO).
#[derive(Clone, Default)]
pub struct S3Config {
    /// `s3://<bucket>` or `s3://<bucket>/<prefix>`.
    pub url: String,
    /// An S3-compatible server's address, e.g. `http://127.0.0.1:9000` (plain HTTP is used
    /// only to an endpoint named with `http://`, unless `AWS_ALLOW_HTTP` says otherwise).
    pub endpoint: Option<String>,
    pub region: Option<String>,
    pub access_key_id: Option<String>,
    pub secret_access_key: Option<String>,
    /// The most bytes of blobs kept on local disk, under the server's root, to read without
    /// asking the bucket; 0 for none.
    pub cache_bytes: u64,
}

/// The secret is not printed.
impl std::fmt::Debug for S3Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("S3Config")
            .field("url", &self.url)
            .field("endpoint", &self.endpoint)
            .field("region", &self.region)
            .field("access_key_id", &self.access_key_id)
            .field("secret_access_key", &self.secret_access_key.as_ref().map(|_| "(set)"))
            .field("cache_bytes", &self.cache_bytes)
            .finish()
    }
}

impl S3Config {
    /// The bucket and prefix of `s3://<bucket>[/<prefix>]`.
    pub(super) fn bucket_and_prefix(&self) -> Result<(&str, Key), StoreError> {
        let bad = || StoreError::Config(format!("expected s3://<bucket>[/<prefix>], not {:?}", self.url));
        let rest = self.url.strip_prefix("s3://").ok_or_else(bad)?;
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            return Err(bad());
        }
        let prefix = Key::parse(prefix.trim_matches('/'))
            .map_err(|e| StoreError::Config(format!("the prefix of {:?}: {e}", self.url)))?;
        Ok((bucket, prefix))
    }

    /// Where the blobs are, as one string: `s3://bucket` or `s3://bucket/prefix`.
    pub fn location(&self) -> Result<String, StoreError> {
        let (bucket, prefix) = self.bucket_and_prefix()?;
        Ok(match prefix.as_ref() {
            "" => format!("s3://{bucket}"),
            prefix => format!("s3://{bucket}/{prefix}"),
        })
    }

    /// The clients for reads, sends and a collection's deletes.
    pub(super) fn clients(&self, bucket: &str) -> Result<Clients, StoreError> {
        let mut builder = AmazonS3Builder::from_env().with_bucket_name(bucket);
        if let Some(endpoint) = &self.endpoint {
            builder = builder.with_endpoint(endpoint);
        }
        if let Some(region) = &self.region {
            builder = builder.with_region(region);
        }
        if let Some(key) = &self.access_key_id {
            builder = builder.with_access_key_id(key);
        }
        if let Some(secret) = &self.secret_access_key {
            builder = builder.with_secret_access_key(secret);
        }
        // Plain HTTP only to an endpoint named with `http://`, whichever way it was given
        // (`AWS_ENDPOINT_URL_S3` wins over `AWS_ENDPOINT_URL`, as the builder has it).
        let endpoint = builder
            .get_config_value(&AmazonS3ConfigKey::S3Endpoint)
            .or_else(|| builder.get_config_value(&AmazonS3ConfigKey::Endpoint));
        let http = if endpoint.is_some_and(|e| e.starts_with("http://")) { "true" } else { "false" };
        builder = unless_set(builder, "AWS_ALLOW_HTTP", ClientConfigKey::AllowHttp, http);
        builder =
            unless_set(builder, "AWS_CONNECT_TIMEOUT", ClientConfigKey::ConnectTimeout, CONNECT_TIMEOUT);
        let retry =
            RetryConfig { max_retries: 3, retry_timeout: Duration::from_secs(60), ..Default::default() };
        builder = builder.with_retry(retry);
        let reads = unless_set(builder.clone(), "AWS_TIMEOUT", ClientConfigKey::Timeout, READ_TOTAL);
        let reads = unless_set(reads, "AWS_READ_TIMEOUT", ClientConfigKey::ReadTimeout, READ_TIMEOUT);
        let removals = builder.clone().with_retry(RetryConfig { max_retries: 0, ..Default::default() });
        // Whatever `AWS_TIMEOUT` says: a claim's length depends on it.
        let removals =
            removals.with_config(AmazonS3ConfigKey::Client(ClientConfigKey::Timeout), REMOVAL_TIMEOUT);
        let sends = unless_set(builder, "AWS_TIMEOUT", ClientConfigKey::Timeout, SEND_TIMEOUT);
        let build = |b: AmazonS3Builder| b.build().map_err(|e| StoreError::Config(e.to_string()));
        Ok(Clients { reads: build(reads)?, sends: build(sends)?, removals: build(removals)? })
    }
}

/// `builder` with client setting `key` at `value`, unless the environment variable `var` set
/// it already.
fn unless_set(builder: AmazonS3Builder, var: &str, key: ClientConfigKey, value: &str) -> AmazonS3Builder {
    if std::env::var_os(var).is_some() {
        builder
    } else {
        builder.with_config(AmazonS3ConfigKey::Client(key), value)
    }
}
