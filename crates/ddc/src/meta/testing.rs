//! For tests of anything that stores metadata: the same test runs against each backend, the
//! embedded SQLite file and a real PostgreSQL server (`tests/common/postgres.rs`).

use std::path::Path;

use super::MetaStore;

#[path = "../../tests/common/postgres.rs"]
mod server;

pub(crate) use server::{TlsFiles, tls_database};

/// A metadata backend to test against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TestBackend {
    Sqlite,
    Postgres,
}

/// Where one test's data lives: a temporary root (its blobs, and with SQLite its metadata),
/// and with Postgres a database of its own.
pub(crate) struct TestPlace {
    dir: tempfile::TempDir,
    url: Option<String>,
}

impl TestPlace {
    /// A new place; `None` when the Postgres tests are skipped (the server module says so).
    pub(crate) fn new(backend: TestBackend) -> Option<TestPlace> {
        let url = match backend {
            TestBackend::Sqlite => None,
            TestBackend::Postgres => Some(server::database()?),
        };
        Some(TestPlace { dir: tempfile::tempdir().unwrap(), url })
    }

    /// The Postgres database's URL (`None` with SQLite).
    pub(crate) fn url(&self) -> Option<&str> {
        self.url.as_deref()
    }

    /// A plain session on the place's database, beside the store's own (Postgres only): what
    /// an operator or another writer does.
    pub(crate) async fn session(&self) -> tokio_postgres::Client {
        let url = self.url.as_deref().expect("a Postgres place");
        let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await.unwrap();
        tokio::spawn(connection);
        client
    }

    /// Runs the docs' command for blobs moved to `location` (Postgres only).
    pub(crate) async fn move_blob_store(&self, location: &str) {
        let moved = format!("UPDATE blob_store SET location = '{location}'");
        assert_eq!(self.session().await.execute(&moved, &[]).await.unwrap(), 1);
    }

    pub(crate) fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Opens the place's metadata (again, if it was opened before).
    pub(crate) async fn open(&self) -> MetaStore {
        match &self.url {
            None => MetaStore::open(self.dir.path()).await.unwrap(),
            Some(url) => MetaStore::open_postgres(url).await.unwrap(),
        }
    }
}

/// Makes each named `async fn(TestBackend)` two tests, `<name>::sqlite` and
/// `<name>::postgres`.
macro_rules! on_each_backend {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            use crate::meta::testing::TestBackend;
            #[tokio::test]
            async fn sqlite() {
                super::$name(TestBackend::Sqlite).await
            }
            #[tokio::test]
            async fn postgres() {
                super::$name(TestBackend::Postgres).await
            }
        }
    )*};
}
pub(crate) use on_each_backend;
