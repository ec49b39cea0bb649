#!/usr/bin/env python3
"""Checks deploy/grafana/*.json: structure a Grafana import needs, and every
PromQL expression rewritten (Grafana variables substituted) into a rules file
that `promtool check rules` parses. Also that every gradsync_* metric the
dashboard queries is documented in docs/metrics.md (so it exists)."""
import json, re, subprocess, sys, tempfile, os

def main(dashboard, metrics_md, promtool):
    d = json.load(open(dashboard))
    errors = []
    for key in ("title", "uid", "panels", "schemaVersion", "templating"):
        if key not in d:
            errors.append(f"missing top-level '{key}'")
    ids = [p.get("id") for p in d.get("panels", [])]
    if len(ids) != len(set(ids)):
        errors.append("panel ids are not unique")
    exprs = []
    for p in d.get("panels", []):
        g = p.get("gridPos", {})
        if not all(k in g for k in ("h", "w", "x", "y")) or g.get("x", 0) + g.get("w", 0) > 24:
            errors.append(f"panel {p.get('title')}: bad gridPos {g}")
        if p.get("type") == "row":
            continue
        if not p.get("targets"):
            errors.append(f"panel {p.get('title')}: no targets")
        for t in p.get("targets", []):
            exprs.append((p.get("title"), t.get("expr", "")))
    documented = set(re.findall(r"`(gradsync_[a-z0-9_]+)`", open(metrics_md).read()))
    for title, e in exprs:
        for m in re.findall(r"\b(gradsync_[a-z0-9_]+)", e):
            base = re.sub(r"_(bucket|count|sum)$", "", m)
            if m not in documented and base not in documented:
                errors.append(f"panel {title}: metric {m} is not in docs/metrics.md")
    if promtool:
        rules = {"groups": [{"name": "dashboard", "rules": []}]}
        for i, (title, e) in enumerate(exprs):
            e = e.replace("$__rate_interval", "5m").replace("$instance", ".*").replace("$job", ".*")
            rules["groups"][0]["rules"].append({"record": f"dashboard:expr{i}", "expr": e})
        with tempfile.NamedTemporaryFile("w", suffix=".yml", delete=False) as f:
            json.dump(rules, f)  # JSON is YAML
            path = f.name
        r = subprocess.run([promtool, "check", "rules", path], capture_output=True, text=True)
        os.unlink(path)
        if r.returncode != 0:
            errors.append("promtool check rules: " + (r.stdout + r.stderr).strip())
    for e in errors:
        print("ERROR", e)
    print(f"{os.path.basename(dashboard)}: {len(d.get('panels', []))} panels, {len(exprs)} queries"
          + (", PromQL checked by promtool" if promtool else ", PromQL not checked (no promtool)"))
    return 1 if errors else 0

if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else ""))
