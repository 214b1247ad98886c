//! Just enough HTTP/1.1 for a tang server (`POST /rec/KID`): plain `http://` URLs, one
//! request per connection, every step bounded by a deadline (an unreachable server must
//! not hold the unlock up).

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

/// Largest response accepted (a JWK is a few hundred bytes).
const MAX_RESPONSE: usize = 64 << 10;

/// `http://HOST[:PORT][/PATH]` split into host, port and path (without a trailing '/').
pub(crate) fn parse_url(url: &str) -> Result<(String, u16, String), String> {
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| format!("{url}: only http:// tang servers are supported"))?;
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], rest[i..].trim_end_matches('/')),
        None => (rest, ""),
    };
    let (host, port) = match authority.rsplit_once(':') {
        Some((h, p)) if !h.ends_with(']') || h.starts_with('[') => (
            h,
            p.parse::<u16>()
                .map_err(|_| format!("{url}: bad port '{p}'"))?,
        ),
        _ => (authority, 80),
    };
    if host.is_empty() {
        return Err(format!("{url}: no host"));
    }
    Ok((host.to_string(), port, path.to_string()))
}

/// POSTs `body` (`content_type`) to `url` + `path` and returns the response body of a
/// 200 answer, all within `timeout`.
pub(crate) fn post(
    url: &str,
    path: &str,
    content_type: &str,
    body: &[u8],
    timeout: Duration,
) -> Result<Vec<u8>, String> {
    request(url, path, Some((content_type, body)), timeout)
}

/// GETs `url` + `path`: the response body of a 200 answer, within `timeout`.
pub(crate) fn get(url: &str, path: &str, timeout: Duration) -> Result<Vec<u8>, String> {
    request(url, path, None, timeout)
}

/// A POST with `body`, else a GET.
fn request(
    url: &str,
    path: &str,
    body: Option<(&str, &[u8])>,
    timeout: Duration,
) -> Result<Vec<u8>, String> {
    let deadline = Instant::now() + timeout;
    let left = || {
        deadline
            .checked_duration_since(Instant::now())
            .filter(|d| !d.is_zero())
            .ok_or_else(|| format!("{url}: no answer within {} s", timeout.as_secs_f32()))
    };
    let (host, port, base) = parse_url(url)?;
    let addrs: Vec<_> = (host.as_str(), port)
        .to_socket_addrs()
        .map_err(|e| format!("{url}: {e}"))?
        .collect();
    let mut last = format!("{url}: no address");
    let mut stream = None;
    for a in addrs {
        match TcpStream::connect_timeout(&a, left()?) {
            Ok(s) => {
                stream = Some(s);
                break;
            }
            Err(e) => last = format!("{url}: {e}"),
        }
    }
    let mut s = stream.ok_or(last)?;
    let request = match body {
        Some((content_type, body)) => format!(
            "POST {base}{path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: {content_type}\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        ),
        None => {
            format!("GET {base}{path} HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: close\r\n\r\n")
        }
    };
    let body = body.map_or(&[][..], |(_, b)| b);
    s.set_write_timeout(Some(left()?))
        .map_err(|e| e.to_string())?;
    s.write_all(request.as_bytes())
        .and_then(|()| s.write_all(body))
        .map_err(|e| format!("{url}: {e}"))?;
    let mut response = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        s.set_read_timeout(Some(left()?))
            .map_err(|e| e.to_string())?;
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                response.extend_from_slice(&buf[..n]);
                if response.len() > MAX_RESPONSE {
                    return Err(format!("{url}: answer too large"));
                }
                // Done once the body its Content-Length gives is in (a server behind
                // socat or inetd may keep the connection open).
                if let Some((split, Some(len))) = head_end(&response)
                    && response.len() >= split + 4 + len
                {
                    response.truncate(split + 4 + len);
                    break;
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(format!("{url}: {e}")),
        }
    }
    let split = response
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| format!("{url}: not an HTTP answer"))?;
    let head = String::from_utf8_lossy(&response[..split]).to_string();
    let status = head.split_whitespace().nth(1).unwrap_or("");
    if status != "200" {
        let line = head.lines().next().unwrap_or("");
        return Err(format!("{url}{base}{path}: {line}"));
    }
    if head.lines().any(|l| {
        l.to_ascii_lowercase()
            .starts_with("transfer-encoding: chunked")
    }) {
        return Err(format!("{url}: chunked answers are not supported"));
    }
    Ok(response[split + 4..].to_vec())
}

/// Where the header ends (the blank line) and the Content-Length it gives, once both
/// are in `response`.
fn head_end(response: &[u8]) -> Option<(usize, Option<usize>)> {
    let split = response.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = String::from_utf8_lossy(&response[..split]);
    let len = head.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.trim()
            .eq_ignore_ascii_case("content-length")
            .then(|| v.trim().parse().ok())
            .flatten()
    });
    Some((split, len))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_split_into_host_port_and_path() {
        assert_eq!(
            parse_url("http://tang.example").unwrap(),
            ("tang.example".into(), 80, "".into())
        );
        assert_eq!(
            parse_url("http://127.0.0.1:8765/tang/").unwrap(),
            ("127.0.0.1".into(), 8765, "/tang".into())
        );
        assert!(parse_url("https://tang.example").is_err());
        assert!(parse_url("http://:80").is_err());
        assert!(parse_url("http://h:port").is_err());
    }
}
