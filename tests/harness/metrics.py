"""ces2pg's HTTP endpoints: a GET, and /metrics parsed (every line checked to be
well formed) into samples.
"""

import re
import socket
import urllib.error
import urllib.request


def http_get(url, timeout=5):
    """(status, body) of a GET; (None, error) when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except (urllib.error.URLError, ConnectionError, socket.timeout) as e:
        return None, str(e)


_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (\S+)$')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_metrics(text):
    """{(name, frozenset(labels)): value}; checks every line is well formed."""
    samples = {}
    typed = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            typed.add(line.split()[2])
            continue
        if line.startswith("#") or not line:
            continue
        m = _SAMPLE.match(line)
        assert m, f"malformed metrics line: {line!r}"
        name, labels, value = m.groups()
        base = re.sub(r"_(bucket|sum|count)$", "", name)
        assert name in typed or base in typed, f"{name} has no # TYPE"
        key = (name, frozenset(_LABEL.findall(labels or "")))
        assert key not in samples, f"duplicate sample {line!r}"
        samples[key] = float(value)
    return samples


def metric(samples, name, **labels):
    """The sample of name with exactly labels (None when there is none)."""
    return samples.get((name, frozenset(labels.items())))


def metric_sum(samples, name, **labels):
    """Sum over every sample of name whose labels include labels."""
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= ls)


def scrape(port):
    """parse_metrics() of a GET of /metrics on 127.0.0.1:port (must answer 200)."""
    status, body = http_get(f"http://127.0.0.1:{port}/metrics")
    assert status == 200, f"/metrics: {status} {body}"
    return parse_metrics(body)
