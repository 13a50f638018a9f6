"""`make test-chaos-cluster` passes a relative --out: the folders the compose file bind-mounts must reach it as
absolute paths, or compose reads `runs/...` as the name of a volume and refuses the project."""

from __future__ import annotations

from pathlib import Path


def test_the_cluster_mounts_a_relative_out_by_its_absolute_path(tmp_path, monkeypatch):
    from entrypoints.chaos_cluster.compose import ChaosCluster

    monkeypatch.chdir(tmp_path)
    cluster = ChaosCluster(Path("runs/seed1"), project="pclchaostest")
    for key in ("CHAOS_RUNS_DIR", "CHAOS_DIR"):
        path = Path(cluster.env[key])
        assert path.is_absolute() and path.is_dir(), (key, path)
        assert path.parent == tmp_path / "runs" / "seed1", (key, path)
