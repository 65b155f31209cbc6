"""An RL loop's weight sync through wsync, written against vLLM's own trainer API only.

On a GPU node with a vLLM in wsync.vllm.SUPPORTED_VLLM, torch with CUDA, transformers, and
this package installed (`pip install integration/python`, which registers the
`vllm.general_plugins` entry point). The library and the job secret, the same in both shells:

    export WSYNC_LIBRARY=$PWD/build/plugin/libwsync.so WSYNC_SECRET=$(openssl rand -hex 32)

Rollout: vLLM on GPUs 0-1, backend wsync (the dev-mode routes carry the weight-update RPCs; the
coordinator, which trainer rank 0 hosts at --coordinator, is the engine's launch configuration:
an init request cannot choose it):

    CUDA_VISIBLE_DEVICES=0,1 VLLM_SERVER_DEV_MODE=1 \
        WSYNC_COORDINATOR_HOST=127.0.0.1 WSYNC_COORDINATOR_PORT=29700 \
        vllm serve Qwen/Qwen2.5-0.5B-Instruct --tensor-parallel-size 2 \
        --weight-transfer-config '{"backend": "wsync"}'

Trainer: one process per GPU (FSDP2 shards when there are several; each rank sends its own
shards, nothing is gathered):

    CUDA_VISIBLE_DEVICES=2,3 torchrun --nproc-per-node 2 integration/python/examples/vllm_rl_loop.py \
        --model Qwen/Qwen2.5-0.5B-Instruct --vllm-url http://127.0.0.1:8000 --num-rollouts 2

Each step takes one optimizer step on a fixed prompt, then `engine.send_weights()` on every rank;
rank 0 then asks vLLM for a greedy completion and (single-process trainer) compares it with the
trainer's own greedy completion of the same prompt. No request should be in flight on the server
while a sync writes the weights in place: pause other traffic around `send_weights()`.
"""

import argparse
import json
import os
import time
import urllib.request

PROMPT = "The capital of France is"


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="Qwen/Qwen2.5-0.5B-Instruct")
    p.add_argument("--vllm-url", default="http://127.0.0.1:8000")
    p.add_argument("--num-rollouts", type=int, required=True,
                   help="vLLM worker processes: tensor x pipeline x data parallel sizes")
    p.add_argument("--coordinator", default="127.0.0.1:29700",
                   help="host:port trainer rank 0 listens on (reachable from the vLLM workers)")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--lr", type=float, default=1e-5)
    p.add_argument("--deadline-seconds", type=float, default=120.0)
    return p.parse_args()


def wait_for_server(url, timeout=600.0):
    """vLLM's GET /health answers 200 once the server (and its workers) are up."""
    deadline = time.time() + timeout
    while True:
        try:
            with urllib.request.urlopen(f"{url.rstrip('/')}/health", timeout=10) as response:
                if response.status == 200:
                    return
        except OSError:
            if time.time() > deadline:
                raise
        time.sleep(2.0)


def complete(url, model, prompt, tokens=12):
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": tokens,
                       "temperature": 0.0}).encode()
    request = urllib.request.Request(f"{url.rstrip('/')}/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read())["choices"][0]["text"]


def main():
    args = parse_args()
    import torch
    import torch.distributed as dist
    from transformers import AutoModelForCausalLM, AutoTokenizer

    # vLLM's trainer-side API; loading vLLM's general plugins registers backend "wsync".
    from vllm.distributed.weight_transfer.base import ModuleSource
    from vllm.distributed.weight_transfer.clients import HTTPVLLMWeightSyncClient
    from vllm.distributed.weight_transfer.factory import WeightTransferTrainerFactory
    from vllm.plugins import load_general_plugins
    from wsync.vllm_trainer import WsyncTrainerInitInfo

    load_general_plugins()
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    torch.cuda.set_device(local_rank)
    if world > 1:
        dist.init_process_group("nccl")
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, torch_dtype=torch.bfloat16).cuda()
    if world > 1:  # FSDP2: every parameter a DTensor Shard(0); wsync reads each rank's shard.
        from torch.distributed.fsdp import fully_shard
        for layer in model.model.layers:
            fully_shard(layer)
        fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)

    wait_for_server(args.vllm_url)
    engine = WeightTransferTrainerFactory.trainer_init(
        WsyncTrainerInitInfo(rank=rank, coordinator=args.coordinator, num_trainers=world,
                             num_rollouts=args.num_rollouts, layout="hf",
                             hf_config=model.config.to_dict(), job_id="vllm-rl-loop",
                             deadline_seconds=args.deadline_seconds),
        client=HTTPVLLMWeightSyncClient(args.vllm_url), source=ModuleSource(model))
    schedule = engine.schedule()
    print(f"[rank {rank}] sends {schedule.get('sent_bytes')} B per sync in "
          f"{schedule.get('rounds')} rounds", flush=True)

    batch = tokenizer([PROMPT + " Paris."], return_tensors="pt").to("cuda")
    for step in range(1, args.steps + 1):
        loss = model(**batch, labels=batch["input_ids"]).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        torch.cuda.synchronize()
        started = time.time()
        engine.send_weights()  # Every rank; raises on every rank if the sync failed anywhere.
        seconds = time.time() - started
        print(f"[rank {rank}] step {step}: loss {loss.item():.4f}, version {engine.version} "
              f"synced in {seconds:.3f} s", flush=True)
        if rank == 0:
            served = complete(args.vllm_url, args.model, PROMPT)
            print(f"  vLLM   : {served!r}", flush=True)
            if world == 1:
                with torch.no_grad():
                    ids = tokenizer([PROMPT], return_tensors="pt").to("cuda")
                    out = model.generate(**ids, max_new_tokens=12, do_sample=False)
                own = tokenizer.decode(out[0, ids["input_ids"].shape[1]:],
                                       skip_special_tokens=True)
                print(f"  trainer: {own!r} ({'same' if own == served else 'DIFFERENT'})",
                      flush=True)
    engine.shutdown()
    if world > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
