"""An RL loop's weight sync into a stock SGLang server through wsync's custom weight loader.

On one GPU node with SGLang 0.5.4 to 0.5.x, torch with CUDA, transformers, and this package
installed (`pip install integration/python`). The library and the job secret, the same in both
shells:

    export WSYNC_SECRET=$(openssl rand -hex 32)

Rollout: SGLang on GPUs 0-1, wsync's loader allowed; the coordinator and wsync's settings are
the server's launch configuration ($WSYNC_SGLANG_INIT), never a request's:

    WSYNC_SGLANG_INIT='{"master_address": "127.0.0.1", "master_port": 29700}' \
    CUDA_VISIBLE_DEVICES=0,1 python -m sglang.launch_server --model-path \
        Qwen/Qwen2.5-0.5B-Instruct --tp-size 2 --port 30000 \
        --custom-weight-loader wsync.sglang.load_weights

Trainer: one process per GPU, each holding the whole model (data parallel); wsync splits the
sending between the replicas:

    CUDA_VISIBLE_DEVICES=2,3 torchrun --nproc-per-node 2 \
        integration/python/examples/sglang_rl_loop.py --model Qwen/Qwen2.5-0.5B-Instruct \
        --sglang-url http://127.0.0.1:30000 --engine-tp 2 [--sglang-session]

--sglang-session: the server has SGLang's weight-update session (/begin_weight_update,
/end_weight_update; the sglang-miles line); wsync.sglang.update_weights then opens and closes it
around every update, target model only. Without it the update carries disable_draft_model.

Each step takes one optimizer step on a fixed prompt, then every rank pushes the version while
rank 0 runs wsync.sglang.update_weights over SGLang's HTTP routes on a helper
thread; the first post connects the SGLang workers. SGLang's numbering: the trainers are ranks
0..world-1 of the update group, the engine's rank_offset is world and world_size world + tp.
The request carries a shared-memory handle of this host (SGLang's serializer): post it from the
server's host, as here. Pause other traffic around a sync: the weights are written in place.
"""

import argparse
import json
import os
import threading
import time
import urllib.request

PROMPT = "The capital of France is"


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="Qwen/Qwen2.5-0.5B-Instruct")
    p.add_argument("--sglang-url", default="http://127.0.0.1:30000")
    p.add_argument("--engine-tp", type=int, required=True, help="the server's --tp-size")
    p.add_argument("--coordinator", default="127.0.0.1:29700",
                   help="host:port trainer rank 0 listens on (reachable from the SGLang workers)")
    p.add_argument("--sglang-session", action="store_true",
                   help="the server has /begin_weight_update and /end_weight_update")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--lr", type=float, default=1e-5)
    p.add_argument("--deadline-seconds", type=float, default=120.0)
    return p.parse_args()


def post(url, route, body, timeout=600.0):
    request = urllib.request.Request(f"{url.rstrip('/')}{route}", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read().decode())


class HttpEngine:
    """SGLang's weight-update calls over its HTTP routes, for wsync.sglang.update_weights."""

    def __init__(self, url, tp, session):
        self.url, self.tp = url, tp
        if session:
            self.begin_weight_update = lambda **body: self._call("/begin_weight_update", body)
            self.end_weight_update = lambda: self._call("/end_weight_update", {})

    def _call(self, route, body):
        reply = post(self.url, route, body)
        return reply.get("success", False), reply.get("message", str(reply))

    def update_weights_from_tensor(self, named_tensors, **fields):
        from sglang.srt.utils import MultiprocessingSerializer
        serialized = MultiprocessingSerializer.serialize(named_tensors, output_str=True)
        return self._call("/update_weights_from_tensor",
                          dict(fields, serialized_named_tensors=[serialized] * self.tp))


def wait_for_server(url, timeout=600.0):
    """SGLang's GET /health answers 200 once the server and its workers are up."""
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


def main():
    args = parse_args()
    import torch
    import torch.distributed as dist
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from wsync import layouts
    from wsync.sglang import update_weights
    from wsync.trainer import TrainerSync

    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    model = AutoModelForCausalLM.from_pretrained(args.model, torch_dtype=torch.bfloat16).cuda()
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    engine = HttpEngine(args.sglang_url, args.engine_tp, args.sglang_session)
    init = {"rank_offset": world, "world_size": world + args.engine_tp,
            "group_name": "weight_update_group",
            "num_trainers": world, "deadline_seconds": args.deadline_seconds}
    if rank == 0:
        wait_for_server(args.sglang_url)
    dist.barrier()
    sync = TrainerSync(model, layouts.hf_layout(model), rank, world, args.coordinator,
                       os.environ["WSYNC_SECRET"], num_rollouts=args.engine_tp,
                       job_id=init["group_name"], deadline_seconds=args.deadline_seconds,
                       connect=False)
    batch = tokenizer(PROMPT, return_tensors="pt").to("cuda")
    for version in range(1, args.steps + 1):
        loss = model(**batch, labels=batch["input_ids"]).loss
        loss.backward()
        for param in model.parameters():  # Data parallel: the replicas stay equal.
            dist.all_reduce(param.grad)
            param.grad /= world
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        failed = []
        if rank == 0:
            def update(version=version):
                try:
                    update_weights(engine, version, init)
                except Exception as error:  # noqa: BLE001  (reported after the push)
                    failed.append(error)
            poster = threading.Thread(target=update)
            poster.start()
        if version == 1:
            sync.connect()  # The workers connect inside their first request.
        sync.push(version)
        if rank == 0:
            poster.join()
            if failed:
                raise failed[0]
            out = post(args.sglang_url, "/generate", {
                "text": PROMPT, "sampling_params": {"max_new_tokens": 8, "temperature": 0}})
            print(f"version {version}: loss {loss.item():.4f}, SGLang: {out['text']!r}",
                  flush=True)
    sync.session.finalize()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
