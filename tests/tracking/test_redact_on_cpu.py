import logging

import pytest

from slca_exp.tracking.redact import (
    REDACTED,
    Redactor,
    install_log_redaction,
    is_secret_key,
    redact_hydra_output,
)

SECRET = "sk-live-9f8e7d6c5b4a"


@pytest.mark.parametrize(
    "key",
    ["api_key", "OPENAI_API_KEY", "judge.hf_token", "password", "client_secret", "apikey", "token"],
)
def test_secret_keys(key):
    assert is_secret_key(key)


@pytest.mark.parametrize(
    "key", ["api_key_env", "max_tokens", "tokens_per_s", "name", "tokenizer", "keys"]
)
def test_not_secret_keys(key):
    assert not is_secret_key(key)


def test_env_secrets_are_found_by_name_and_by_config():
    environ = {
        "OPENAI_API_KEY": SECRET,
        "MY_JUDGE_CRED": "another-long-value",
        "HOME": "/home/someone",
        "SHORT_TOKEN": "1",
    }
    r = Redactor.from_env(["MY_JUDGE_CRED"], environ=environ)
    text = f"{SECRET} and another-long-value in /home/someone, 1"
    assert r.text(text) == f"{REDACTED} and {REDACTED} in /home/someone, 1"


def test_nested_mapping_urls_and_pairs():
    r = Redactor([SECRET])
    data = {
        "judge": {"api_key": "x", "api_key_env": "JUDGE_KEY", "max_tokens": 10},
        "urls": [f"https://user:{SECRET}@host/v1", "http://127.0.0.1:8000/v1?token=abc&n=1"],
        "note": f"prefix {SECRET} suffix",
    }
    out = r.mapping(data)
    assert out["judge"] == {"api_key": REDACTED, "api_key_env": "JUDGE_KEY", "max_tokens": 10}
    assert out["urls"] == [
        f"https://{REDACTED}@host/v1",
        f"http://127.0.0.1:8000/v1?token={REDACTED}&n=1",
    ]
    assert out["note"] == f"prefix {REDACTED} suffix"
    assert SECRET not in repr(out)
    # Override lists (Hydra) and log lines: key=value pairs.
    assert r.text("+judge.api_key=abc max_tokens=3") == f"+judge.api_key={REDACTED} max_tokens=3"


def test_log_records_are_redacted_before_handlers_write(tmp_path):
    log_file = tmp_path / "train.log"
    handler = logging.FileHandler(log_file)
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        install_log_redaction(Redactor([SECRET]))
        install_log_redaction(Redactor([SECRET]))  # idempotent
        assert sum(type(f).__name__ == "RedactingFilter" for f in handler.filters) == 1
        logging.getLogger("slca_exp.some.module").warning("calling with key %s", SECRET)
    finally:
        root.removeHandler(handler)
        handler.close()
    text = log_file.read_text()
    assert SECRET not in text and f"calling with key {REDACTED}" in text


def test_hydra_output_files_are_rewritten(tmp_path):
    (tmp_path / ".hydra").mkdir()
    (tmp_path / ".hydra" / "overrides.yaml").write_text(
        f"- judge.base_url=http://u:{SECRET}@127.0.0.1:9/v1\n"
    )
    (tmp_path / "multirun.yaml").write_text(f"env: {SECRET}\n")
    redact_hydra_output(Redactor([SECRET]), tmp_path, None)
    for path in (tmp_path / ".hydra" / "overrides.yaml", tmp_path / "multirun.yaml"):
        assert SECRET not in path.read_text() and REDACTED in path.read_text()
