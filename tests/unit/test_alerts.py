"""The alert rules (``deploy/alerts.yml``): valid for Prometheus, and each one firing on
the series that mean trouble and quiet on a healthy cluster (``deploy/alerts_test.yml``),
both checked by Debian's ``promtool``, which ``make setup`` installs (package
``prometheus``)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.support import REPO_ROOT

DEPLOY = REPO_ROOT / "deploy"
RULES = DEPLOY / "alerts.yml"
UNIT_TESTS = DEPLOY / "alerts_test.yml"

#: What the issue asks alerts for, by the alert that covers it.
REQUIRED = {
    "DiscoveryNoLeader",
    "DiscoveryLiveListStale",
    "DiscoveryMassLossBrakeEngaged",
    "DiscoveryHighPartialRate",
    "DiscoveryDataServersForcedOffline",
    "DiscoveryZooKeeperSessionChurn",
    "DiscoveryFencePoisoned",
    "DiscoveryShardWithoutReplica",
}


def _promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.fail("promtool not found: `make setup` installs it (Debian package prometheus)")
    return path


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [_promtool(), *argv], capture_output=True, text=True, timeout=60, check=False
    )


def _rules() -> list[dict[str, object]]:
    document = yaml.safe_load(RULES.read_text())
    return [rule for group in document["groups"] for rule in group["rules"]]


def test_promtool_accepts_the_rules() -> None:
    result = _run("check", "rules", str(RULES))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(_rules())} rules found" in result.stdout


def test_every_alert_fires_and_stays_quiet_as_its_unit_tests_say() -> None:
    result = _run("test", "rules", str(UNIT_TESTS))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_every_required_alert_exists_has_a_runbook_and_a_unit_test() -> None:
    rules = {rule["alert"]: rule for rule in _rules()}
    assert set(rules) >= REQUIRED
    for name, rule in rules.items():
        annotations = rule.get("annotations")
        assert isinstance(annotations, dict), name
        assert annotations.get("summary"), name
        assert annotations.get("runbook"), name
        assert rule.get("labels", {}).get("severity") in {"warning", "critical"}, name
    tests = yaml.safe_load(UNIT_TESTS.read_text())["tests"]
    tested = {case["alertname"] for test in tests for case in test["alert_rule_test"]}
    assert tested == set(rules)
    # ...and each one is tested firing at least once, not only quiet.
    firing = {
        case["alertname"]
        for test in tests
        for case in test["alert_rule_test"]
        if case.get("exp_alerts")
    }
    assert firing == set(rules)


def test_a_wrong_expectation_fails(tmp_path: Path) -> None:
    # The unit tests can fail: the same tests against a rule with another threshold.
    (tmp_path / "alerts.yml").write_text(RULES.read_text().replace("> 0.05", "> 0.5"))
    (tmp_path / "alerts_test.yml").write_text(UNIT_TESTS.read_text())
    result = _run("test", "rules", str(tmp_path / "alerts_test.yml"))
    assert result.returncode != 0
    assert "DiscoveryHighPartialRate" in result.stdout + result.stderr


def test_the_compose_prometheus_loads_the_rules(tmp_path: Path) -> None:
    config = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())
    assert config["rule_files"] == ["/etc/prometheus/alerts.yml"]
    compose = yaml.safe_load((DEPLOY.parent / "docker-compose.yml").read_text())
    volumes = compose["services"]["prometheus"]["volumes"]
    assert "./deploy/alerts.yml:/etc/prometheus/alerts.yml:ro" in volumes
    # The whole configuration, with the rule file where the container mounts it here.
    config["rule_files"] = [str(RULES)]
    local = tmp_path / "prometheus.yml"
    local.write_text(yaml.safe_dump(config))
    result = _run("check", "config", str(local))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(_rules())} rules found" in result.stdout
