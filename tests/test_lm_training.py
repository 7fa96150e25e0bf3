"""Language-model training: resumes bit-exactly, accumulation and data parallelism compute the same steps as
one process, a checkpoint of another tokenizer is refused."""

import json
import os
import socket
import time

import pytest
import torch
import torch.multiprocessing as mp

from loglin_edu.data.corpus import Document
from loglin_edu.data.token_stream import build_stream
from loglin_edu.data.tokenizer import ByteTokenizer, train_bpe
from loglin_edu.layers import ModelConfig
from loglin_edu.train.lm import LMTrainConfig, train_lm

TEXT = "And God said, Let there be light: and there was light. And God saw the light, that it was good.\n"


def streams(folder, tokenizer=None):
    tokenizer = tokenizer or ByteTokenizer()
    docs = [Document("t", "a", TEXT * 20), Document("t", "b", TEXT[::-1] * 20)]
    train = build_stream(docs, tokenizer, folder / "train")
    val = build_stream([Document("t", "c", TEXT * 5)], tokenizer, folder / "validation")
    return train, val


def model_config(mixer="loglinear_mamba2", vocab=256):
    options = dict(backend="torch", form="naive")
    if mixer == "transformer":
        options.update(num_heads=2)
    elif "mamba" in mixer:
        options.update(d_state=8, head_dim=8)
    return ModelConfig(mixer, vocab_size=vocab, d_model=16, n_layers=1, max_len=32, mlp=True, mixer_options=options)


CONFIG = LMTrainConfig(steps=6, batch_size=4, context=16, lr=3e-3, warmup_steps=2, eval_every=3, eval_windows=4,
                       eval_batch_size=2, amp=False)


def val_losses(record):
    return [(h["step"], h["val_loss"]) for h in record["history"]]


@pytest.mark.parametrize("mixer", ["loglinear_mamba2", "loglinear_gated_deltanet"])
def test_training_resumes_bit_exactly(tmp_path, mixer):
    train, val = streams(tmp_path)
    run = dict(seed=1, progress=False)
    model_a, straight = train_lm(model_config(mixer), CONFIG, train, val, out_dir=tmp_path / "a", **run)
    _, first = train_lm(model_config(mixer), CONFIG, train, val, out_dir=tmp_path / "b", stop_at=4, **run)
    assert not first["complete"] and first["steps_done"] == 4
    with (tmp_path / "b" / "log.jsonl").open("a") as f:  # a crash after the checkpoint left a line behind
        f.write(json.dumps(dict(step=5, seconds=0.0)) + "\n")
    model_b, resumed = train_lm(model_config(mixer), CONFIG, train, val, out_dir=tmp_path / "b", **run)
    assert resumed["complete"] and straight["complete"]
    for (name, a), b in zip(model_a.state_dict().items(), model_b.state_dict().values()):
        assert torch.equal(a, b), name
    assert val_losses(straight) == val_losses(resumed) and [s for s, _ in val_losses(straight)] == [3, 6]
    logged = [json.loads(line)["step"] for line in (tmp_path / "b" / "log.jsonl").read_text().splitlines()]
    assert logged == [3, 6]
    assert straight["final"]["val_loss"] < straight["history"][0]["val_loss"] + 1.0


def test_a_deadline_stops_evaluates_and_resumes(tmp_path):
    train, val = streams(tmp_path)
    _, stopped = train_lm(model_config(), CONFIG, train, val, out_dir=tmp_path / "r", progress=False,
                          deadline=time.time())
    assert not stopped["complete"] and stopped["steps_done"] == 1 and stopped["final"]["step"] == 1
    _, resumed = train_lm(model_config(), CONFIG, train, val, out_dir=tmp_path / "r", progress=False)
    assert resumed["complete"] and [h["step"] for h in resumed["history"]] == [1, 3, 6]


def test_a_checkpoint_of_another_tokenizer_is_refused(tmp_path):
    train, val = streams(tmp_path / "bytes")
    train_lm(model_config(), CONFIG, train, val, out_dir=tmp_path / "run", progress=False, stop_at=1)
    bpe = train_bpe([TEXT * 20, TEXT[::-1] * 20], vocab_size=300)
    train2, val2 = streams(tmp_path / "bpe", bpe)
    with pytest.raises(ValueError, match=r"vocabulary 256\).*vocabulary \d+\): train from the data folder"):
        train_lm(model_config(vocab=bpe.vocab_size), CONFIG, train2, val2, out_dir=tmp_path / "run", progress=False)


def test_accumulation_takes_the_same_steps(tmp_path):
    train, val = streams(tmp_path)
    cfg = LMTrainConfig(**{**CONFIG.__dict__, "steps": 3, "eval_every": 1})
    _, whole = train_lm(model_config("gated_deltanet"), cfg, train, val, progress=False)
    accumulating = LMTrainConfig(**{**cfg.__dict__, "micro_batch_size": 1})
    _, split = train_lm(model_config("gated_deltanet"), accumulating, train, val, progress=False)
    a = torch.tensor([h["train_loss"] for h in whole["history"]] + [h["val_loss"] for h in whole["history"]])
    b = torch.tensor([h["train_loss"] for h in split["history"]] + [h["val_loss"] for h in split["history"]])
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="micro_batch_size=3"):
        LMTrainConfig(batch_size=4, micro_batch_size=3).accumulation(1)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_device_setup_chooses_is_the_one_training_uses():
    """A world of one keeps the device :func:`setup` chose (a GPU, when asked for), not the CPU default."""
    from loglin_edu.train import distributed

    try:
        assert distributed.setup("meta").device == torch.device("meta")
        assert distributed.current() == distributed.World(0, 1, torch.device("meta"))
    finally:
        distributed.teardown()
    assert distributed.current().device == torch.device("cpu")


def _ddp_worker(rank, world_size, port, folder, result_path):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE=str(world_size))
    torch.set_num_threads(1)
    from loglin_edu.data.token_stream import open_stream
    from loglin_edu.train import distributed

    distributed.setup("cpu")
    tok = ByteTokenizer()
    train, val = open_stream(folder / "train", tok), open_stream(folder / "validation", tok)
    cfg = LMTrainConfig(**{**CONFIG.__dict__, "steps": 3, "eval_every": 1})
    _, record = train_lm(model_config("transformer"), cfg, train, val, seed=2, progress=False)
    if rank == 0:
        result_path.write_text(json.dumps(record["history"]))
    distributed.teardown()


def test_two_gloo_processes_train_as_one(tmp_path):
    """torch DDP over 2 CPU processes (gloo) with the same global batch: the losses of a single process."""
    train, val = streams(tmp_path)
    torch.set_num_threads(1)
    cfg = LMTrainConfig(**{**CONFIG.__dict__, "steps": 3, "eval_every": 1})
    _, single = train_lm(model_config("transformer"), cfg, train, val, seed=2, progress=False)
    mp.start_processes(_ddp_worker, args=(2, _free_port(), tmp_path, tmp_path / "ddp.json"), nprocs=2, join=True,
                       start_method="spawn")
    ddp = json.loads((tmp_path / "ddp.json").read_text())
    assert [h["world_size"] for h in ddp] == [2, 2, 2]
    for key in ("train_loss", "val_loss"):
        expected = torch.tensor([h[key] for h in single["history"]])
        torch.testing.assert_close(torch.tensor([h[key] for h in ddp]), expected, rtol=1e-5, atol=1e-6)
