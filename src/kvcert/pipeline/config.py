"""Validation of the Snakemake configuration, one line per mistake.

Snakemake's own schema validation reports a wrong key with a long JSON-schema
message; this check runs first and says which key is wrong, what it might have meant,
and which keys exist.
"""

from __future__ import annotations

import difflib
from pathlib import Path

import yaml


class PipelineConfigError(ValueError):
    pass


def check_pipeline_config(config: dict, schema_path: str | Path, configs_dir: str | Path) -> dict:
    schema = yaml.safe_load(Path(schema_path).read_text())
    allowed = schema["properties"]
    for key, value in config.items():
        if key not in allowed:
            close = difflib.get_close_matches(key, list(allowed), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise PipelineConfigError(f"config key {key!r} is unknown{hint}; known keys: {', '.join(allowed)}")
        expected = allowed[key]["type"]
        if expected == "boolean" and isinstance(value, str) and value.lower() in ("true", "false"):
            config[key] = value.lower() == "true"  # --config retrain_model=true arrives as a string
        elif expected == "boolean" and not isinstance(value, bool):
            raise PipelineConfigError(f"config key {key!r} must be true or false, got {value!r}")
    experiments = sorted(p.stem for p in (Path(configs_dir) / "experiment").glob("*.yaml"))
    if config["experiment"] not in experiments:
        raise PipelineConfigError(
            f"config key 'experiment': no configs/experiment/{config['experiment']}.yaml; choose one of {', '.join(experiments)}"
        )
    return config
