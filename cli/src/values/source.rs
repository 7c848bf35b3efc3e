//! Where a `-f` argument reads its values from: a file, standard input or a URL, bounded in
//! size and time.

use std::{
    io::Read,
    path::{Path, PathBuf},
    time::Duration,
};

use serde_json::Value as Json;

use super::{
    ValuesError,
    yaml::{check_yaml_1_1, parse_yaml},
};

/// The most a values source may hold (a values file is a few kilobytes).
pub const MAX_VALUES_BYTES: u64 = 16 << 20;

/// How long fetching a values URL may take, connection and body included.
pub const URL_TIMEOUT: Duration = Duration::from_secs(30);

/// Where a `-f` argument reads from, as Helm (and so Linkerd) takes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ValuesSource {
    /// `-`: standard input.
    Stdin,
    /// An `http://` or `https://` URL.
    Url(String),
    /// A path.
    File(PathBuf),
}

impl ValuesSource {
    /// What `-f` names.
    pub fn parse(arg: &str) -> Self {
        let lower = arg.to_ascii_lowercase();
        if arg.trim() == "-" {
            ValuesSource::Stdin
        } else if lower.starts_with("http://") || lower.starts_with("https://") {
            ValuesSource::Url(arg.to_string())
        } else {
            ValuesSource::File(PathBuf::from(arg))
        }
    }

    /// How errors and warnings name it.
    pub fn origin(&self) -> String {
        match self {
            ValuesSource::Stdin => "values from standard input".into(),
            ValuesSource::Url(url) => format!("values URL {url}"),
            ValuesSource::File(path) => format!("values file {}", path.display()),
        }
    }

    /// Reads and parses it.
    pub fn read(&self) -> Result<Json, ValuesError> {
        let origin = self.origin();
        let read_err = |reason: String| ValuesError::Read {
            origin: origin.clone(),
            reason,
        };
        let text = match self {
            ValuesSource::Stdin => {
                let mut text = String::new();
                std::io::stdin()
                    .take(MAX_VALUES_BYTES)
                    .read_to_string(&mut text)
                    .map_err(|e| read_err(e.to_string()))?;
                text
            }
            ValuesSource::File(path) => {
                std::fs::read_to_string(path).map_err(|e| read_err(e.to_string()))?
            }
            ValuesSource::Url(url) => fetch(url).map_err(read_err)?,
        };
        let tree = parse_yaml(&text, &origin)?;
        check_yaml_1_1(&text, &tree, &origin)?;
        Ok(tree)
    }
}

/// GETs a values URL as Helm's HTTP getter does: redirects followed, the proxy from the
/// environment, the answer must be a success; bounded in time and size.
fn fetch(url: &str) -> Result<String, String> {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(URL_TIMEOUT))
        .http_status_as_error(false)
        .build()
        .into();
    let mut response = agent.get(url).call().map_err(|e| e.to_string())?;
    let status = response.status();
    let body = response
        .body_mut()
        .with_config()
        .limit(MAX_VALUES_BYTES)
        .read_to_string()
        .map_err(|e| format!("reading the answer: {e}"))?;
    if !status.is_success() {
        let text: String = body.chars().take(200).collect();
        return Err(format!("the server answered {status}: {text}"));
    }
    Ok(body)
}

/// Reads a `-f` values file.
pub fn read_values_file(path: &Path) -> Result<Json, ValuesError> {
    ValuesSource::File(path.to_path_buf()).read()
}
