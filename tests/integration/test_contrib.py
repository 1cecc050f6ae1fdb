"""contrib/: the Grafana dashboard and the Prometheus alerting rules.

- Every metric name the dashboard's and the rules' PromQL use is one a running ces2pg exports on
  /metrics (scraped after a small generated stream and a dead letter, so that the counters with
  labels have samples), and every metric it exports is on the dashboard.
- The rules pass `promtool check rules` (a broken copy does not), and their unit tests
  (contrib/prometheus/ces2pg-alerts.test.yaml) pass `promtool test rules`.
- Every dashboard expression is valid PromQL (promtool, as recording rules); the dashboard's
  structure is one Grafana 9/10 imports (data source variable, ids, grid).
- A real Prometheus scraping such a ces2pg with the rules loaded answers every dashboard query
  with the labels its legend shows, and fires the one alert it should (a dead letter).

promtool and prometheus come with Debian's prometheus package (scripts/lib.sh installs it for the
tests); without them those checks are skipped, except under CI where that is a failure.
"""

import copy
import json
import os
import re
import shutil
import subprocess
import urllib.parse

import pytest

from harness.common import ROOT, free_port, wait_until
from harness.events import generate
from harness.metrics import http_get
from harness.progress import wait_applied

CONTRIB = ROOT / "contrib"
DASHBOARD = CONTRIB / "grafana" / "ces2pg.json"
RULES = CONTRIB / "prometheus" / "ces2pg-alerts.yaml"
RULE_TESTS = CONTRIB / "prometheus" / "ces2pg-alerts.test.yaml"
GROUP = "ces2pg-contrib"

# Metrics a ces2pg that applied a stream still renders without samples: only their # HELP and
# # TYPE lines. Referring to them is fine; any other metric must have a sample.
NO_SAMPLES_YET = {
    "ces2pg_transactions_torn_total":
        "a series per partition appears with its first torn transaction",
    "ces2pg_identity_token_expiry_seconds":
        "a series per side that logs in with Microsoft Entra ID",
    "ces2pg_identity_token_fetch_failures_total":
        "a series per side that logs in with Microsoft Entra ID",
    "ces2pg_partitions_not_owned":
        "the writer counts them every 10 s once it has joined the group",
}
# Metrics /metrics exports that the dashboard need not show.
NOT_ON_DASHBOARD = {
    "ces2pg_scrape_timestamp_seconds": "when the page was made: Prometheus keeps its own",
}
# Not ces2pg's: Prometheus's own series of each target.
PROMETHEUS_SERIES = {"up"}


# --------------------------------------------------------------------------
# PromQL: the metric names an expression uses
# --------------------------------------------------------------------------

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_LABEL_LIST = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_GRAFANA_VAR = re.compile(r"\$\{[^}]*\}|\$\w+")
_NAME = re.compile(r"(?<![\w.:])[a-zA-Z_:][\w:]*")
_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or",
             "unless", "offset", "atan2", "inf", "nan"}


def metric_names(expr):
    """The metric names in a PromQL expression (or a Grafana label_values(METRIC, LABEL) query):
    identifiers that are not functions or aggregations (followed by "("), keywords, label names
    (inside {...} and by/without/on/ignoring/group_left/group_right (...)), strings, durations,
    numbers or Grafana variables."""
    s = _STRING.sub('""', expr)
    s = re.sub(r"\{[^{}]*\}", " ", s)          # label matchers
    s = re.sub(r"\blabel_values\s*\(([^,()]*),\s*\w+\s*\)", r"(\1)", s)
    s = re.sub(r"\[[^\[\]]*\]", " ", s)        # ranges and subqueries: [5m], [1h:1m]
    s = _LABEL_LIST.sub(" ", s)
    s = _GRAFANA_VAR.sub(" ", s)
    names = set()
    for m in _NAME.finditer(s):
        name = m.group(0)
        if name.lower() in _KEYWORDS or s[m.end():].lstrip().startswith("("):
            continue
        names.add(name)
    return names


def test_metric_names_parser():
    cases = {
        'sum by (table, op) (rate(ces2pg_events_applied_total{job=~"$job", '
        'instance=~"$instance"}[$__rate_interval]))': {"ces2pg_events_applied_total"},
        "histogram_quantile(0.99, sum by (le, instance) (rate(a_bucket[5m])))": {"a_bucket"},
        "sum(rate(a_sum[1m])) by (instance) / sum without (le) (rate(a_count[1m]))":
            {"a_sum", "a_count"},
        "(a == bool 1) * on (job, instance) group_left(version) (b > bool 0)": {"a", "b"},
        "increase(c[10m]) > 0 or (c > 0 unless c offset 10m)": {"c"},
        "time() - d{x=\"y}\"} > 1e6": {"d"},
        "deriv(e[15m:1m]) > 0 and e > 10000": {"e"},
        'label_values(ces2pg_build_info{job=~"$job"}, instance)': {"ces2pg_build_info"},
        'absent(up{job="ces2pg"})': {"up"},
        "sum(f{a=~\"${instance}\"}) or vector(0)": {"f"},
    }
    for expr, want in cases.items():
        assert metric_names(expr) == want, expr


# --------------------------------------------------------------------------
# What the dashboard and the rules refer to
# --------------------------------------------------------------------------


def load_dashboard():
    return json.loads(DASHBOARD.read_text())


def load_rules():
    yaml = pytest.importorskip("yaml")
    return yaml.safe_load(RULES.read_text())


def all_panels(dash):
    for p in dash["panels"]:
        yield p
        yield from p.get("panels", [])       # panels of a collapsed row


def dashboard_queries(dash):
    """(where, PromQL) of every panel target and every query variable."""
    for p in all_panels(dash):
        for t in p.get("targets", []):
            yield f'panel "{p["title"]}" {t["refId"]}', t["expr"]
    for v in dash["templating"]["list"]:
        if v["type"] == "query":
            q = v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
            yield f'variable {v["name"]}', q


def rule_queries(rules):
    for g in rules["groups"]:
        for r in g["rules"]:
            yield f'rule {r.get("alert") or r.get("record")}', r["expr"]


def referenced(queries):
    """{metric name: [where it is used]}"""
    out = {}
    for where, expr in queries:
        for name in metric_names(expr):
            out.setdefault(name, []).append(where)
    return out


def exposition(text):
    """(names with a sample, {metric family: type}) of a /metrics page."""
    samples, types = set(), {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split()
            types[name] = kind
        elif line and not line.startswith("#"):
            samples.add(re.match(r"[a-zA-Z_:][\w:]*", line).group(0))
    return samples, types


def unknown_metrics(refs, samples, types):
    """What is wrong with the names refs uses, given a scrape: names /metrics does not have (a
    histogram's series are NAME_bucket, NAME_sum and NAME_count, never NAME), and names with only
    a # TYPE line that NO_SAMPLES_YET does not explain."""
    queryable = set()
    for name, kind in types.items():
        if kind == "histogram":
            queryable |= {name + "_bucket", name + "_sum", name + "_count"}
        else:
            queryable.add(name)
    problems = []
    for name, where in sorted(refs.items()):
        if name in PROMETHEUS_SERIES or name in samples:
            continue
        if name not in queryable:
            problems.append(f"{name} (in {', '.join(where)}) is not a metric /metrics exports")
        elif name not in NO_SAMPLES_YET:
            problems.append(f"{name} (in {', '.join(where)}) has no sample after a stream")
    return problems


def settled_scrape(port):
    """The /metrics page once the stream has shown in every gauge the dashboard plots."""
    def ready():
        status, body = http_get(f"http://127.0.0.1:{port}/metrics")
        assert status == 200, body
        samples, _ = exposition(body)
        want = {"ces2pg_replication_delay_seconds", "ces2pg_reorder_window_seconds",
                "ces2pg_consumer_lag", "ces2pg_process_resident_memory_bytes"}
        return body if want <= samples else None

    return wait_until(ready, 20, message="the gauges of an applied stream to show on /metrics")


def applied_stream(tmp_path, db, broker, ces2pg):
    """A ces2pg with /metrics on a free port that applied a small stream over 2 partitions and
    dead-lettered a record. Returns (daemon, port, the /metrics page)."""
    b = broker(partitions=2)
    expect = generate(tmp_path, seed=9090, events=200, tables=3, broker=b)
    b.produce("ces", [b"not a CES record"], partition=0)   # a dead letter: reason="decode"
    port = free_port()
    daemon = ces2pg(db, b, group=GROUP, http_listen=f"127.0.0.1:{port}")
    want = {int(p): n for p, n in expect["partition_records"].items()}
    want[0] += 1
    wait_applied(db, GROUP, want, daemons=[daemon])
    return daemon, port, settled_scrape(port)


def test_dashboard_and_rules_use_only_exported_metrics(tmp_path, db, broker, ces2pg):
    daemon, _, body = applied_stream(tmp_path, db, broker, ces2pg)
    samples, types = exposition(body)
    for name, why in NO_SAMPLES_YET.items():
        assert name in types, f"{name} ({why}) has no # TYPE line on /metrics"

    dash_refs = referenced(dashboard_queries(load_dashboard()))
    rule_refs = referenced(rule_queries(load_rules()))
    assert "ces2pg_events_applied_total" in dash_refs and "up" in rule_refs  # the parser works
    problems = unknown_metrics(dash_refs, samples, types) + unknown_metrics(rule_refs, samples,
                                                                            types)
    assert not problems, "\n".join(problems)

    # Every metric ces2pg exports is on the dashboard.
    def family(name):
        base = re.sub(r"_(bucket|sum|count)$", "", name)
        return base if types.get(base) == "histogram" else name

    shown = {family(n) for n in dash_refs}
    missing = sorted(set(types) - shown - set(NOT_ON_DASHBOARD))
    assert not missing, f"exported but not on the dashboard: {missing}"

    # And the check fails where it must: a panel naming a metric that does not exist, a
    # histogram named without its suffix, a counter left without samples.
    broken = load_dashboard()
    panel = next(p for p in all_panels(broken) if p["type"] == "timeseries")
    panel["targets"].append(copy.deepcopy(panel["targets"][0]))
    panel["targets"][-1].update(refId="Z", expr="rate(ces2pg_events_aplied_total[5m])")
    problems = unknown_metrics(referenced(dashboard_queries(broken)), samples, types)
    assert len(problems) == 1 and "ces2pg_events_aplied_total" in problems[0], problems
    problems = unknown_metrics({"ces2pg_batch_duration_seconds": ["x"]}, samples, types)
    assert problems and "not a metric" in problems[0], problems
    assert unknown_metrics({"ces2pg_late_events_total": ["x"]}, samples - {
        "ces2pg_late_events_total"}, types), "a counter without samples passed"
    assert daemon.terminate() == 0


# --------------------------------------------------------------------------
# Prometheus and promtool
# --------------------------------------------------------------------------


def prometheus_tool(name):
    path = shutil.which(name)
    if path is None:
        why = f"{name} is not installed (Debian: prometheus)"
        if os.environ.get("CI") == "true":
            pytest.fail(why + ": under CI a skipped check is a failure")
        pytest.skip(why)
    return path


def run_promtool(*args, cwd=None):
    return subprocess.run([prometheus_tool("promtool"), *[str(a) for a in args]],
                          capture_output=True, text=True, timeout=120, cwd=cwd,
                          stdin=subprocess.DEVNULL)


# Values for Grafana's variables when a dashboard query runs outside Grafana.
GRAFANA_VARS = {"$__rate_interval": "15s", "$__range": "1m", "$__interval": "1s",
                "${datasource}": "x", "$job": ".*", "$instance": ".*"}


def as_promql(expr):
    for k, v in GRAFANA_VARS.items():
        expr = expr.replace(k, v)
    assert "$" not in expr, expr
    return expr


def prometheus_query(port, expr):
    status, body = http_get(f"http://127.0.0.1:{port}/api/v1/query?"
                            + urllib.parse.urlencode({"query": expr}))
    assert status == 200, f"{expr}: {status} {body}"
    answer = json.loads(body)
    assert answer["status"] == "success", answer
    return answer["data"]["result"]


def test_prometheus_runs_the_dashboard_and_the_rules(tmp_path, db, broker, ces2pg):
    """A real Prometheus (Debian's) scrapes a ces2pg that applied a stream with a dead letter,
    every second, with the rules loaded: the dashboard's variables find their labels, every
    dashboard query returns series carrying the labels its legend names (torn transactions
    excepted: there are none), Up, PostgreSQL connected and Ready are 1, and the one alert that
    fires is CES2PGDeadLetters (reason decode)."""
    binary = prometheus_tool("prometheus")
    daemon, port, _ = applied_stream(tmp_path, db, broker, ces2pg)
    prom_port = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(json.dumps({   # JSON is YAML
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(RULES)],
        "scrape_configs": [{"job_name": "ces2pg",
                            "static_configs": [{"targets": [f"127.0.0.1:{port}"]}]}]}))
    log_path = tmp_path / "prometheus.log"
    with open(log_path, "wb") as log:
        prom = subprocess.Popen(
            [binary, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{prom_port}", "--log.level=warn"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        def log_tail():
            return log_path.read_text(errors="replace")[-3000:]

        def samples_enough():
            assert prom.poll() is None, f"prometheus exited {prom.returncode}:\n{log_tail()}"
            if http_get(f"http://127.0.0.1:{prom_port}/-/ready")[0] != 200:
                return False
            r = prometheus_query(
                prom_port, 'count_over_time(ces2pg_records_consumed_total{job="ces2pg"}[1m])')
            return r and float(r[0]["value"][1]) >= 8

        wait_until(samples_enough, 60, interval=0.5,
                   message=lambda: f"8 scrapes of ces2pg by prometheus\n{log_tail()}")

        for where, expr in dashboard_queries(load_dashboard()):
            if where.startswith("variable"):       # label_values(METRIC, LABEL)
                metric, label = re.fullmatch(r"label_values\((.*),\s*(\w+)\)", expr).groups()
                result = prometheus_query(prom_port, as_promql(metric))
                assert result and all(label in r["metric"] for r in result), (where, result)
        for p in all_panels(load_dashboard()):
            for t in p.get("targets", []):
                result = prometheus_query(prom_port, as_promql(t["expr"]))
                assert result or metric_names(t["expr"]) <= set(NO_SAMPLES_YET), (
                    f'panel "{p["title"]}" {t["refId"]}: no series for {t["expr"]}')
                for series in result:
                    for label in re.findall(r"\{\{\s*(\w+)\s*\}\}", t["legendFormat"]):
                        assert label in series["metric"], (
                            f'panel "{p["title"]}" {t["refId"]}: legend {{{{{label}}}}}, '
                            f'series {series["metric"]}')
                if p["title"] in ("Up", "PostgreSQL connected", "Ready (/readyz)"):
                    assert [s["value"][1] for s in result] == ["1"], (p["title"], result)

        def alerts():
            r = prometheus_query(prom_port, "ALERTS")
            return r if any(a["metric"]["alertstate"] == "firing" for a in r) else None

        fired = wait_until(alerts, 30, message=lambda: f"an alert to fire\n{log_tail()}")
        got = sorted((a["metric"]["alertname"], a["metric"]["alertstate"],
                      a["metric"].get("reason")) for a in fired)
        assert got == [("CES2PGDeadLetters", "firing", "decode")], got
    finally:
        prom.terminate()
        try:
            prom.wait(timeout=30)
        except subprocess.TimeoutExpired:
            prom.kill()
            prom.wait()
    assert daemon.terminate() == 0


def test_rules_pass_promtool_check(tmp_path):
    r = run_promtool("check", "rules", RULES)
    assert r.returncode == 0, r.stdout + r.stderr
    n = sum(1 for _ in rule_queries(load_rules()))
    assert f"SUCCESS: {n} rules found" in r.stdout, r.stdout
    # promtool rejects a broken copy (so a check that accepts anything fails here).
    for old, new in (("deriv(ces2pg_consumer_lag[15m])", "deriv(ces2pg_consumer_lag[15m]"),
                     ("{{ $labels.instance }} is down", "{{ $labels.instance }is down")):
        broken = tmp_path / "broken.yaml"
        assert old in RULES.read_text(), old
        broken.write_text(RULES.read_text().replace(old, new, 1))
        r = run_promtool("check", "rules", broken)
        assert r.returncode != 0, (new, r.stdout + r.stderr)


def test_rules_unit_tests(tmp_path):
    """ces2pg-alerts.test.yaml against the rules without their annotations (promtool would
    compare those verbatim; see the test file)."""
    yaml = pytest.importorskip("yaml")
    rules = load_rules()
    for g in rules["groups"]:
        for r in g["rules"]:
            r.pop("annotations", None)
    (tmp_path / RULES.name).write_text(yaml.safe_dump(rules))
    shutil.copy(RULE_TESTS, tmp_path / RULE_TESTS.name)
    spec = yaml.safe_load(RULE_TESTS.read_text())
    assert spec["rule_files"] == [RULES.name]
    tested = {t["alertname"] for test in spec["tests"] for t in test["alert_rule_test"]}
    alerts = {r["alert"] for g in rules["groups"] for r in g["rules"] if "alert" in r}
    assert tested == alerts, f"alerts without a unit test: {sorted(alerts - tested)}"
    r = run_promtool("test", "rules", RULE_TESTS.name, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr


def test_dashboard_expressions_are_promql(tmp_path):
    """Each dashboard query as a recording rule (Grafana's variables given values):
    `promtool check rules` parses them."""
    yaml = pytest.importorskip("yaml")
    rules = []
    for i, (where, expr) in enumerate(dashboard_queries(load_dashboard())):
        if where.startswith("variable"):
            continue
        rules.append({"record": f"dashboard:query{i}", "expr": as_promql(expr)})
    path = tmp_path / "dashboard-queries.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    r = run_promtool("check", "rules", path)
    assert r.returncode == 0, r.stdout + r.stderr


# --------------------------------------------------------------------------
# The dashboard's and the rules' structure
# --------------------------------------------------------------------------


def test_dashboard_structure():
    dash = load_dashboard()
    assert dash["uid"] == "ces2pg" and dash["title"]
    assert "id" not in dash or dash["id"] is None   # Grafana assigns it on import
    assert 36 <= dash["schemaVersion"] <= 38        # Grafana 9.0 .. 10.x
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    ds = variables["datasource"]
    assert (ds["type"], ds["query"]) == ("datasource", "prometheus")
    want_ds = {"type": "prometheus", "uid": "${datasource}"}
    for name in ("job", "instance"):
        assert variables[name]["datasource"] == want_ds
    ids, cells = set(), set()
    for p in all_panels(dash):
        assert p["id"] not in ids, f"duplicate panel id {p['id']}"
        ids.add(p["id"])
        g = p["gridPos"]
        assert g["x"] >= 0 and g["w"] > 0 and g["x"] + g["w"] <= 24, p["title"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f'panel "{p["title"]}" overlaps another'
                cells.add((x, y))
        if p["type"] == "row":
            continue
        assert p["title"] and p.get("description"), p["id"]
        assert p["datasource"] == want_ds, p["title"]
        assert p["targets"], p["title"]
        refs = [t["refId"] for t in p["targets"]]
        assert len(refs) == len(set(refs)), p["title"]
        for t in p["targets"]:
            assert t["datasource"] == want_ds and t["expr"].strip(), (p["title"], t)


def test_rules_say_what_to_do():
    readme = (CONTRIB / "README.md").read_text()
    for g in load_rules()["groups"]:
        for r in g["rules"]:
            assert r["labels"]["severity"] in ("critical", "warning"), r["alert"]
            ann = r["annotations"]
            assert ann["summary"].strip() and ann["description"].strip(), r["alert"]
            assert "README" in ann["description"], f'{r["alert"]}: point at the README'
            assert r["alert"] in readme, f'{r["alert"]} is not described in contrib/README.md'
