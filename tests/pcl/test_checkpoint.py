"""pcl.checkpoint_store: atomic commit, crash leftovers, newest-complete lookup, pruning, --resume resolution."""

from __future__ import annotations

import errno
import json
import os

import pytest

import pcl.checkpoint_store as ckpt


def write(root, step, complete=True):
    tmp = ckpt.begin(root, step)
    (tmp / "state.json").write_text(json.dumps({"step": step}))
    (tmp / "policy").mkdir()
    (tmp / "policy" / "model.safetensors").write_bytes(b"x" * step)
    return ckpt.commit(tmp, root, step, {"policy_version": step}) if complete else tmp


def test_commit_makes_a_complete_named_checkpoint_and_lists_its_files(tmp_path):
    final = write(tmp_path, 12)
    assert final == tmp_path / "step-000012" and ckpt.is_complete(final)
    meta = json.loads((final / ckpt.COMPLETE).read_text())
    assert meta["step"] == 12 and meta["policy_version"] == 12
    assert meta["files"] == ["policy/model.safetensors", "state.json"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
    assert ckpt.step_of(final) == 12


def test_an_interrupted_write_is_never_taken_for_a_checkpoint(tmp_path):
    write(tmp_path, 2)
    write(tmp_path, 4, complete=False)  # the process died before commit: only a .tmp- directory
    (tmp_path / "step-000006").mkdir()  # renamed by hand, no COMPLETE marker
    assert ckpt.latest(tmp_path) == tmp_path / "step-000002"
    with pytest.raises(FileNotFoundError, match="incomplete"):
        ckpt.resolve(tmp_path / "step-000006", tmp_path)


def test_latest_orders_by_step_number_not_by_name_or_time(tmp_path):
    for step in (9, 10, 100, 99):
        write(tmp_path, step)
    os.utime(tmp_path / "step-000009", (1e10, 1e10))
    assert [p.name for p in ckpt.complete_checkpoints(tmp_path)] == [
        "step-000009", "step-000010", "step-000099", "step-000100"]
    assert ckpt.latest(tmp_path).name == "step-000100"


def test_prune_keeps_the_newest_k_and_removes_dead_leftovers(tmp_path):
    for step in (1, 2, 3, 4):
        write(tmp_path, step)
    dead = tmp_path / ".tmp-step-000005-999999999"  # a pid that cannot exist
    dead.mkdir()
    mine = ckpt.begin(tmp_path, 6)  # this process is writing it: it stays
    removed = ckpt.prune(tmp_path, keep=2)
    assert sorted(p.name for p in removed) == [".tmp-step-000005-999999999", "step-000001", "step-000002"]
    assert [p.name for p in ckpt.complete_checkpoints(tmp_path)] == ["step-000003", "step-000004"]
    assert mine.exists()


def test_recommitting_a_step_replaces_it_whole(tmp_path):
    write(tmp_path, 3)
    tmp = ckpt.begin(tmp_path, 3)
    (tmp / "state.json").write_text('{"again": true}')
    final = ckpt.commit(tmp, tmp_path, 3)
    assert json.loads((final / "state.json").read_text()) == {"again": True}
    assert not (final / "policy").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["step-000003"]


def test_resume_accepts_a_run_dir_a_checkpoints_dir_or_a_checkpoint(tmp_path):
    run = tmp_path / "run"
    write(run / "checkpoints", 2)
    newest = write(run / "checkpoints", 5)
    assert ckpt.resolve("", run) == newest
    assert ckpt.resolve(run, tmp_path / "elsewhere") == newest
    assert ckpt.resolve(run / "checkpoints", tmp_path) == newest
    assert ckpt.resolve(run / "checkpoints" / "step-000002", tmp_path).name == "step-000002"
    with pytest.raises(FileNotFoundError, match="no complete checkpoint"):
        ckpt.resolve("", tmp_path / "empty")


def test_write_json_is_atomic_and_leaves_no_temporary(tmp_path):
    ckpt.write_json(tmp_path / "a.json", {"x": 1})
    ckpt.write_json(tmp_path / "a.json", {"x": 2})
    assert json.loads((tmp_path / "a.json").read_text()) == {"x": 2}
    assert [p.name for p in tmp_path.iterdir()] == ["a.json"]


def write_parts(tmp, size: int) -> None:
    """What the parts of a checkpoint do: a small JSON file, then a large tensor file."""
    import torch

    ckpt.write_json(tmp / "state.json", {"step": 1})
    torch.save({"model": torch.zeros(size // 4, dtype=torch.float32)}, tmp / "learner.pt")


def test_a_write_that_fills_the_disk_leaves_no_partial_checkpoint(tmp_path):
    from tests.small_disk import tmpfs

    with tmpfs(tmp_path / "disk", size="1m") as disk:
        root = disk / "checkpoints"
        with ckpt.writing(root, 1) as tmp:
            write_parts(tmp, 300_000)
            first = ckpt.commit(tmp, root, 1)
        # A real ENOSPC from the filesystem, which torch.save reports as a RuntimeError (an iostream error).
        with pytest.raises((OSError, RuntimeError)), ckpt.writing(root, 2) as tmp:
            write_parts(tmp, 2_000_000)
            ckpt.commit(tmp, root, 2)
        assert sorted(p.name for p in root.iterdir()) == ["step-000001"]  # no .tmp-*, the earlier one intact
        assert ckpt.latest(root) == first and ckpt.is_complete(first)


def test_a_failed_write_is_removed_injected_enospc(tmp_path, monkeypatch):
    import torch

    root = tmp_path / "checkpoints"
    write(root, 1)

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", full)
    with pytest.raises(OSError, match="No space left"), ckpt.writing(root, 2) as tmp:
        write_parts(tmp, 1000)
    assert sorted(p.name for p in root.iterdir()) == ["step-000001"]


def test_free_space_is_checked_before_a_checkpoint_naming_the_directory_and_the_bytes(tmp_path):
    from tests.small_disk import tmpfs

    with tmpfs(tmp_path / "disk", size="1m") as disk:
        root = disk / "checkpoints"
        assert ckpt.check_free_space(root, 1, estimate=0) == 0  # nothing to go by: no check
        with pytest.raises(ckpt.CheckpointSpaceError) as refused:  # the first checkpoint: the state's estimate
            ckpt.check_free_space(root, 1, estimate=2_000_000)
        assert refused.value.errno == errno.ENOSPC
        assert f"checkpoint at step 1: not enough free space in {root}: 2.0 MiB (2100000 bytes) needed" in str(
            refused.value)
        with ckpt.writing(root, 1) as tmp:
            write_parts(tmp, 600_000)
            ckpt.commit(tmp, root, 1)
        recorded = json.loads((root / "step-000001" / ckpt.COMPLETE).read_text())["bytes"]
        assert recorded == ckpt.tree_bytes(root / "step-000001") - len(
            (root / "step-000001" / ckpt.COMPLETE).read_bytes())  # COMPLETE itself is written after the count
        # The next one would not fit beside it: refused before anything is written, whatever the estimate.
        with pytest.raises(ckpt.CheckpointSpaceError, match=r"the size of step-000001, plus 5%\), .* free"):
            ckpt.check_free_space(root, 2, estimate=0)
        assert sorted(p.name for p in root.iterdir()) == ["step-000001"]
    # On a roomy disk the same checkpoint passes.
    assert ckpt.check_free_space(tmp_path / "roomy", 1, estimate=1000) == 1050


def test_partial_checkpoints_are_removed_at_start_whoever_left_them(tmp_path):
    root = tmp_path / "checkpoints"
    write(root, 1)
    left = write(root, 2, complete=False)
    reused = root / ".tmp-step-000003-1"  # pid 1 is alive: a reused pid, not the writer; prune keeps it
    reused.mkdir()
    ckpt.prune(root, keep=5)
    assert reused.exists()
    aside = write(root, 4)  # a crash between commit's two renames: step-000004 renamed aside, no new one
    os.replace(aside, root / ".old-step-000004-999999")
    removed = ckpt.remove_partial(root)
    assert sorted(p.name for p in removed) == sorted([left.name, reused.name])
    assert [p.name for p in ckpt.complete_checkpoints(root)] == ["step-000001", "step-000004"]
    assert sorted(p.name for p in root.iterdir()) == ["step-000001", "step-000004"]
