"""`aiq check` against the fake server: a healthy setup, a bad key, a missing model, and more."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import API_KEY, aiq_env, run_aiq, write_prompts
from fakeserver import FakeServer

pytestmark = pytest.mark.slow  # every test here runs aiq or a server in real time


def _check(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> tuple[int, dict]:
    proc = run_aiq("check", "--json", *args, cwd=tmp_path, env=env)
    assert API_KEY not in proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    report = json.loads(proc.stdout)
    assert report["exit_code"] == proc.returncode
    return proc.returncode, {f["subject"]: f for f in report["findings"]}


def _anthropic_env(key: str = API_KEY) -> dict[str, str]:
    env = aiq_env(ANTHROPIC_API_KEY=key)
    env.pop("ANTHROPIC_BASE_URL", None)
    return env


def test_healthy_setup_is_all_ok(tmp_path: Path, server: FakeServer) -> None:
    # The price the user pays, not aiq's list price: that one warns once it is 180 days old.
    (tmp_path / "aiq.yaml").write_text("prices: {gpt-4o-mini: {input: 0.15, output: 0.6}}\n")
    code, found = _check(tmp_path, "--base-url", server.base_url, "--model", "gpt-4o-mini")

    assert code == 0
    assert {f["status"] for f in found.values()} == {"ok"}
    assert "gpt-4o-mini is listed" in found["model"]["message"]
    assert "OPENAI_API_KEY" in found["API key"]["message"]
    assert "does not exist yet" in found["store"]["message"]
    assert not (tmp_path / ".aiq").exists()  # check writes nothing
    assert [r.path for r in server.requests] == ["/v1/models"]  # no billable request


def test_text_output_is_one_line_per_finding(tmp_path: Path, server: FakeServer) -> None:
    proc = run_aiq("check", "--base-url", server.base_url, "--model", "nope", cwd=tmp_path)

    lines = proc.stdout.splitlines()
    assert all(line.startswith(("ok   ", "warn ", "FAIL ")) for line in lines), lines
    (model,) = [line for line in lines if line.startswith("FAIL model:")]
    assert "→ fix --model" in model


def test_bad_key_fails_naming_the_variable_and_never_the_key(
    tmp_path: Path, server: FakeServer
) -> None:
    env = aiq_env(OPENAI_API_KEY="sk-wrong-key-4242")

    code, found = _check(tmp_path, "--base-url", server.base_url, "--model", "gpt-4o-mini", env=env)

    assert code == 4
    assert found["API key"]["status"] == "FAIL"
    assert "HTTP 401" in found["API key"]["message"]
    assert "OPENAI_API_KEY" in found["API key"]["fix"]
    assert "sk-wrong-key-4242" not in json.dumps(found)


def test_missing_model_fails_with_the_closest_one(tmp_path: Path, server: FakeServer) -> None:
    code, found = _check(tmp_path, "--base-url", server.base_url, "--model", "gpt-4o-mimi")

    assert code == 4
    assert found["model"]["status"] == "FAIL"
    assert "closest: gpt-4o-mini" in found["model"]["message"]
    assert found["endpoint"]["status"] == "ok"


def test_unreachable_endpoint_fails(tmp_path: Path) -> None:
    with FakeServer() as gone:
        url = gone.base_url  # a port nobody listens on once it stops

    code, found = _check(tmp_path, "--base-url", url, "--model", "gpt-4o-mini")

    assert code == 4
    assert found["endpoint"]["status"] == "FAIL" and "base-url" in found["endpoint"]["fix"]


def test_missing_key_for_the_official_api_fails_without_calling_it(tmp_path: Path) -> None:
    env = aiq_env()
    del env["OPENAI_API_KEY"]

    code, found = _check(tmp_path, "--model", "gpt-4o-mini", env=env)

    assert code == 2
    assert found["API key"]["status"] == "FAIL" and "not set" in found["API key"]["message"]
    assert found["endpoint"]["status"] == "warn"


def test_anthropic_healthy_bad_key_and_missing_model(tmp_path: Path, server: FakeServer) -> None:
    args = ("--provider", "anthropic", "--base-url", server.base_url)

    code, found = _check(tmp_path, *args, "--model", "claude-sonnet-4-5", env=_anthropic_env())
    assert code == 0, found
    assert "ANTHROPIC_API_KEY" in found["API key"]["message"]
    assert "$3 in / $15 out" in found["price"]["message"]

    code, found = _check(tmp_path, *args, "--model", "claude-x", env=_anthropic_env())
    assert code == 4 and found["model"]["status"] == "FAIL"

    code, found = _check(tmp_path, *args, "--model", "claude-sonnet-4-5", env=_anthropic_env("no"))
    assert code == 4 and found["API key"]["status"] == "FAIL"
    assert {r.had_api_key for r in server.requests} == {True}  # Anthropic's header, not Bearer


def test_every_unknown_config_key_is_a_finding(tmp_path: Path) -> None:
    (tmp_path / "aiq.yaml").write_text("concurency: 3\nmodle: x\n")

    code, _ = _check(tmp_path)
    proc = run_aiq("check", cwd=tmp_path)

    assert code == 2
    assert "did you mean 'concurrency'" in proc.stdout
    assert "did you mean 'model'" in proc.stdout


def test_store_is_checked_read_only(tmp_path: Path, server: FakeServer) -> None:
    write_prompts(tmp_path / "p.jsonl", [("a", "hi"), ("b", "there")])
    assert run_aiq("add", "p.jsonl", "--model", "gpt-4o-mini", cwd=tmp_path).returncode == 0

    code, found = _check(tmp_path, "--base-url", server.base_url, "--model", "gpt-4o-mini")

    assert code == 0
    assert "2 jobs (2 queued" in found["store"]["message"]

    (tmp_path / "junk.db").write_text("not a database, just text " * 100)
    code, found = _check(tmp_path, "--base-url", server.base_url, "--db", "junk.db")
    assert code == 2
    assert found["store"]["status"] == "FAIL"


def test_an_unpriced_model_is_a_warning_and_a_failure_under_max_cost(tmp_path: Path) -> None:
    code, found = _check(tmp_path, "--provider", "simulated", "--model", "house-model")
    assert code == 0 and found["price"]["status"] == "warn"

    (tmp_path / "aiq.yaml").write_text("max_cost: 5\n")
    code, found = _check(tmp_path, "--provider", "simulated", "--model", "house-model")
    assert code == 2 and found["price"]["status"] == "FAIL"
    assert "prices:" in found["price"]["fix"]


def test_a_base_url_without_v1_is_checked_where_a_run_sends(
    tmp_path: Path, server: FakeServer
) -> None:
    base = server.base_url.removesuffix("/v1")  # http://127.0.0.1:PORT

    code, found = _check(tmp_path, "--base-url", base, "--model", "gpt-4o-mini")

    assert code == 0, found  # it works: the run adds /v1, and so does check
    assert found["endpoint"]["status"] == "ok"
    assert f"{base}/v1/models answered" in found["endpoint"]["message"]
    note = found["base URL"]
    assert note["status"] == "warn" and f"{base}/v1/chat/completions" in note["message"]
    assert f"did you mean {base}/v1?" in note["fix"]
    write_prompts(tmp_path / "p.jsonl", [("a", "hi")])
    ran = run_aiq("run", "p.jsonl", "--base-url", base, "--model", "gpt-4o-mini", cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    assert [r.path for r in server.requests] == ["/v1/models", "/v1/chat/completions"]


def test_a_base_url_with_v1_gets_no_note(tmp_path: Path, server: FakeServer) -> None:
    code, found = _check(tmp_path, "--base-url", server.base_url + "/", "--model", "gpt-4o-mini")

    assert code == 0 and "base URL" not in found


def test_a_missing_key_the_server_wants_says_to_set_it(tmp_path: Path, server: FakeServer) -> None:
    env = aiq_env()
    del env["OPENAI_API_KEY"]
    args = ("--base-url", server.base_url, "--model", "gpt-4o-mini")

    code, found = _check(tmp_path, *args, env=env)
    text = run_aiq("check", *args, cwd=tmp_path, env=env).stdout

    assert code == 4
    key = found["API key"]
    assert key["status"] == "FAIL" and "not set" in key["message"] and "HTTP 401" in key["message"]
    assert key["fix"].startswith("set it: export OPENAI_API_KEY=")
    # One line about the key: not "fine" first, then "check the key".
    (line,) = [line for line in text.splitlines() if "API key:" in line]
    assert line.startswith("FAIL") and "check the key" not in line


def test_a_4xx_from_the_model_list_is_not_called_passing(tmp_path: Path) -> None:
    args = ("--model", "gpt-4o-mini")
    with FakeServer(status_for_all=400) as refusing:
        code, found = _check(tmp_path, "--base-url", refusing.base_url, *args)
    assert code == 4
    endpoint = found["endpoint"]
    assert endpoint["status"] == "FAIL" and "HTTP 400: Invalid request." in endpoint["message"]
    assert "try again later" not in endpoint["fix"] and "--base-url" in endpoint["fix"]

    with FakeServer(status_for_all=503) as overloaded:
        code, found = _check(tmp_path, "--base-url", overloaded.base_url, *args)
    assert code == 4
    assert "overloaded" in found["endpoint"]["message"]
    assert "try again later" in found["endpoint"]["fix"]


def test_it_says_what_bounds_the_requests_in_flight(tmp_path: Path, server: FakeServer) -> None:
    args = ("--base-url", server.base_url, "--model", "gpt-4o-mini")
    (tmp_path / "aiq.yaml").write_text("max_concurrency: 8\n")
    _, found = _check(tmp_path, *args)
    assert found["concurrency"]["status"] == "ok"
    assert found["concurrency"]["message"] == "auto, up to 8 in flight (bound by max_concurrency 8)"
    # A fixed number over what the open files (raised to the hard limit) allow would fail
    # its connections: said before the run.
    (tmp_path / "aiq.yaml").write_text("concurrency: 100000000\n")
    code, found = _check(tmp_path, *args)
    assert found["concurrency"]["status"] == "warn"
    assert "--concurrency 100,000,000 is over the" in found["concurrency"]["message"]
    assert code == 0  # a warning: the run may still go
