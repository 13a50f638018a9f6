"""One adapter per experiment-tracker library, behind the same five calls: `log(metrics, step)`,
`annotate(step, kind, text)`, `log_config(config)`, `summary(figures, step)`, `close()`. Each imports its
library in its constructor, so a library is imported only when `logging.backends` names it.

Where each writes, by default (nothing leaves the machine unless the library is configured to):
- tensorboard: event files in RUN_DIR/tensorboard (a resumed run adds a new event file to the same directory);
- wandb: the run in RUN_DIR/wandb; offline with WANDB_MODE=offline (then `wandb sync` uploads it later);
- mlflow: logging.mlflow_tracking_uri, else MLFLOW_TRACKING_URI, else a local store in RUN_DIR/mlruns;
- trackio: its local database (TRACKIO_DIR, else its cache directory).
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

from pcl.config import Config, redacted


def flat_config(cfg: Config) -> dict[str, Any]:
    """The config as dotted keys (`selection.tau`), secrets left out: no control token, no password in a URL."""
    tree = redacted(cfg, token_mask=None).model_dump(mode="json")
    tree["control"].pop("token", None)
    out: dict[str, Any] = {}

    def walk(prefix: str, node: Any) -> None:
        if isinstance(node, dict) and node:
            for key, value in node.items():
                walk(f"{prefix}.{key}" if prefix else key, value)
        else:
            out[prefix] = node if isinstance(node, (int, float, str, bool)) or node is None else json.dumps(node)

    walk("", tree)
    return out


class TensorBoardAdapter:
    def __init__(self, cfg: Config, run_dir: Path, run_id: str | None):
        from torch.utils.tensorboard import SummaryWriter  # needs the tensorboard package

        self.run_id = run_id or cfg.run.name
        self.writer = SummaryWriter(log_dir=str(run_dir / "tensorboard"))

    def log(self, metrics: dict[str, float], step: int) -> None:
        for key, value in metrics.items():
            self.writer.add_scalar(key, value, global_step=step)
        self.writer.flush()

    def annotate(self, step: int, kind: str, text: str) -> None:
        self.writer.add_text(f"events/{kind}", text, global_step=step)

    def log_config(self, config: dict[str, Any]) -> None:
        rows = "\n".join(f"| {k} | {v} |" for k, v in config.items())
        self.writer.add_text("config", "| key | value |\n|---|---|\n" + rows, global_step=0)

    def summary(self, figures: dict[str, float], step: int) -> None:
        rows = "\n".join(f"| {k} | {v:.4g} |" for k, v in figures.items())
        self.writer.add_text("summary", "| figure | value |\n|---|---|\n" + rows, global_step=step)

    def close(self, failed: bool = False) -> None:
        self.writer.close()


class WandbAdapter:
    def __init__(self, cfg: Config, run_dir: Path, run_id: str | None):
        import wandb

        self.wandb = wandb
        self.run = wandb.init(project=cfg.logging.project, name=cfg.run.name, id=run_id or uuid.uuid4().hex[:12],
                              resume="allow", dir=str(run_dir), reinit="create_new",
                              settings=wandb.Settings(console="off", silent=True))
        self.run_id = self.run.id
        self.pending: dict[str, Any] = {}  # annotations, sent with the next step (wandb's steps only go forward)

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.run.log({**metrics, **self.pending}, step=step, commit=True)
        self.pending = {}

    def annotate(self, step: int, kind: str, text: str) -> None:
        self.pending[f"events/{kind}"] = self.wandb.Html(f"<pre>{text}</pre>", inject=False)

    def log_config(self, config: dict[str, Any]) -> None:
        self.run.config.update(config, allow_val_change=True)

    def summary(self, figures: dict[str, float], step: int) -> None:
        self.run.summary.update({f"summary/{k}": v for k, v in figures.items()})

    def close(self, failed: bool = False) -> None:
        if self.pending:  # annotations after the last step: kept in the run's summary
            self.run.summary.update({k: v.html if hasattr(v, "html") else v for k, v in self.pending.items()})
        self.run.finish(exit_code=1 if failed else 0)


class MlflowAdapter:
    def __init__(self, cfg: Config, run_dir: Path, run_id: str | None):
        from mlflow.tracking import MlflowClient

        uri = cfg.logging.mlflow_tracking_uri  # MLFLOW_TRACKING_URI when unset: applied by the config loader
        artifacts = None
        if not uri:  # a local store in the run directory, its artifacts beside it (not in the working directory)
            uri = f"sqlite:///{(run_dir / 'mlflow.db').resolve()}"
            artifacts = (run_dir / "mlflow-artifacts").resolve().as_uri()
        self.client = MlflowClient(tracking_uri=uri)
        if run_id is None:
            experiment = self.client.get_experiment_by_name(cfg.logging.project)
            experiment_id = experiment.experiment_id if experiment else \
                self.client.create_experiment(cfg.logging.project, artifact_location=artifacts)
            run_id = self.client.create_run(experiment_id, run_name=cfg.run.name).info.run_id
        else:  # resumed: the same run, running again
            self.client.update_run(run_id, status="RUNNING")
        self.run_id = run_id

    def log(self, metrics: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(k, v, now, step) for k, v in metrics.items()])

    def annotate(self, step: int, kind: str, text: str) -> None:
        self.client.set_tag(self.run_id, f"event.{step:06d}.{kind}", text[:5000])

    def log_config(self, config: dict[str, Any]) -> None:
        from mlflow.entities import Param

        params = [Param(k, str(v)[:6000]) for k, v in config.items()]
        for start in range(0, len(params), 100):  # MLflow takes at most 100 params per batch
            self.client.log_batch(self.run_id, params=params[start:start + 100])

    def summary(self, figures: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        self.client.log_batch(self.run_id, metrics=[Metric(f"summary/{k}", v, 0, step) for k, v in figures.items()])
        self.client.log_text(self.run_id, json.dumps(figures, indent=2), "summary.json")

    def close(self, failed: bool = False) -> None:
        self.client.set_terminated(self.run_id, status="FAILED" if failed else "FINISHED")


class TrackioAdapter:
    def __init__(self, cfg: Config, run_dir: Path, run_id: str | None):
        import trackio

        self.trackio = trackio
        name = run_id or f"{cfg.run.name}-{uuid.uuid4().hex[:8]}"
        self.run = trackio.init(project=cfg.logging.project, name=name, resume="allow" if run_id else "never",
                                  config=flat_config(cfg), auto_log_cpu=False, auto_log_gpu=False)
        self.run_id = name

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.trackio.log(metrics, step=step)

    def annotate(self, step: int, kind: str, text: str) -> None:
        pass  # trackio has no text annotations: the control/tau and control/k curves show the change

    def log_config(self, config: dict[str, Any]) -> None:
        pass  # trackio takes the config at init only; see RUN_DIR/config.yaml

    def summary(self, figures: dict[str, float], step: int) -> None:
        pass  # a summary row would be a second row at the last step

    def close(self, failed: bool = False) -> None:
        self.trackio.finish()


ADAPTERS = {"tensorboard": TensorBoardAdapter, "wandb": WandbAdapter, "mlflow": MlflowAdapter,
            "trackio": TrackioAdapter}
