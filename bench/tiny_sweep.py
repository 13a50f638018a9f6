"""A single-process PCL / GRPO / oracle loop on the tiny task, for fast hyper-parameter sweeps.

The same algorithm as the coordinator (docs/architecture.md) without Ray, Redis or FSDP: candidates from an
epoch-shuffled sampler, V's scores, select_closest, n samples at temperature 1, group-mean advantages,
pcl.rl.policy_gradient_loss over the m*n batch with AdamW and gradient clipping, V trained on the
selected prompts, 32 unfiltered probes per step for V's explained variance. `oracle` selects on true
rollouts of all k*m candidates (k times the generation: the upper bound a perfect V approaches).
Rewards are the integer comparison that pcl.reward.verdict.math_reward makes on the tiny task's digit-only
answers, so the loop needs no math-verify; it runs where only torch and transformers are installed.

    python bench/tiny_sweep.py build --warm-steps 800 --out /tmp/w800           # a warm-started policy
    python bench/tiny_sweep.py train --model /tmp/w800 --strategy pcl --lr 1e-4 --k 2 --out pcl.jsonl
    python bench/tiny_sweep.py summary *.jsonl                                   # gains at step 240 / best

Each step appends one JSON line (eval lines carry eval_t1 / eval_t06 / eval_greedy and per-level accuracy).
On one H100 a 300-step run takes about 90 s, and fifteen runs share the GPU side by side.
"""
import argparse, json, math, os, sys, time
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import numpy as np, torch

def int_reward(text, gold):
    t = text.strip()
    return 1.0 if t.isdigit() and int(t) == int(gold) else 0.0

def build(args):
    import pcl.reward.verdict, pcl.tiny.build as b
    pcl.reward.verdict.math_reward = int_reward
    b.build_tiny(seed=args.seed, out_dir=args.out, steps=args.warm_steps, verbose=True, force=True)

def load_rows(path):
    return [json.loads(l) for l in open(path)]

def train(args):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from pcl.rl import group_advantages, effective_ratio, explained_variance, policy_gradient_loss, token_logprobs
    from pcl.strategies.selection import select_closest
    from pcl.models.value import ValueModel, ValueTrainer
    from pcl.tiny.task import format_prompt
    dev = torch.device(args.device)
    torch.manual_seed(args.seed); rng = np.random.default_rng(args.seed)
    tok = AutoTokenizer.from_pretrained(args.model)
    pol = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).to(dev)
    opt = torch.optim.AdamW(pol.parameters(), lr=args.lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / max(1, args.warmup)))
    vm = ValueModel.from_pretrained(args.model, device=dev)
    vt = ValueTrainer(vm, lr=args.vlr, grad_clip=1.0, batch_size=256)
    train_rows = load_rows(os.path.join(args.model, "train.jsonl"))
    eval_rows = load_rows(os.path.join(args.model, "eval.jsonl"))[:args.eval_size]
    enc = lambda rows: [tok(format_prompt(r["problem"])).input_ids for r in rows]
    train_ids, eval_ids = enc(train_rows), enc(eval_rows)
    eos, pad = tok.eos_token_id, tok.pad_token_id
    order, cursor = rng.permutation(len(train_rows)), 0

    def draw(count):
        nonlocal order, cursor
        out = []
        while len(out) < count:
            if cursor >= len(order):
                order, cursor = rng.permutation(len(train_rows)), 0
            take = min(count - len(out), len(order) - cursor)
            out += list(order[cursor:cursor + take]); cursor += take
        return out

    @torch.no_grad()
    def generate(ids_list, golds, n, temperature):
        width = max(len(x) for x in ids_list)
        inp = torch.tensor([[pad] * (width - len(x)) + x for x in ids_list], device=dev)
        att = (torch.arange(width, device=dev)[None] >= torch.tensor([width - len(x) for x in ids_list], device=dev)[:, None]).long()
        kw = dict(do_sample=True, temperature=temperature, top_k=0, top_p=1.0) if temperature > 0 else dict(do_sample=False)
        out = pol.generate(input_ids=inp, attention_mask=att, num_return_sequences=n, max_new_tokens=args.max_new,
                           pad_token_id=pad, eos_token_id=eos, **kw)
        resp = out[:, width:].tolist()
        rewards, responses = [], []
        for i, r in enumerate(resp):
            gold = golds[i // n]
            if eos in r:
                r = r[:r.index(eos) + 1]
                rewards.append(int_reward(tok.decode(r[:-1], skip_special_tokens=True), gold))
            else:
                rewards.append(0.0)
            responses.append(r)
        return np.array(rewards).reshape(len(ids_list), n), responses

    def evaluate():
        res = {}
        golds = [r["answer"] for r in eval_rows]
        pol.eval()
        r1, _ = generate(eval_ids, golds, 4, 1.0)
        r6, _ = generate(eval_ids, golds, 4, 0.6)
        rg, _ = generate(eval_ids, golds, 1, 0.0)
        lv = np.array([r["difficulty"] for r in eval_rows])
        res["eval_t1"] = float(r1.mean()); res["eval_t06"] = float(r6.mean()); res["eval_greedy"] = float(rg.mean())
        res["eval_by_level"] = [round(float(r1[lv == l].mean()), 3) for l in range(1, 8)]
        return res

    log = open(args.out, "w")
    rec = {"step": 0, **evaluate()}; log.write(json.dumps(rec) + "\n"); log.flush()
    print(rec, flush=True)
    m, n, k = args.m, args.n, args.k
    probes = []
    t0 = time.time()
    for step in range(1, args.steps + 1):
        pool = draw(m if args.strategy == "uniform" else k * m)
        pool_ids = [train_ids[i] for i in pool]; pool_gold = [train_rows[i]["answer"] for i in pool]
        pol.eval()
        rec = {"step": step}
        if args.strategy == "uniform":
            chosen = np.arange(m)
            rewards, responses = generate(pool_ids, pool_gold, n, 1.0)
        elif args.strategy == "oracle":
            allr, allresp = generate(pool_ids, pool_gold, n, 1.0)
            chosen = select_closest(allr.mean(1), m, args.tau)
            rewards = allr[chosen]; responses = [allresp[i * n + j] for i in chosen for j in range(n)]
        else:
            values = vt.score(pool_ids)
            chosen = select_closest(values, m, args.tau)
            probe = rng.choice(len(pool), size=args.probe, replace=False)
            sel = list(chosen) + [int(i) for i in probe]
            allr, allresp = generate([pool_ids[i] for i in sel], [pool_gold[i] for i in sel], n, 1.0)
            rewards = allr[:m]; responses = allresp[:m * n]
            probes = (probes + [(values[probe], allr[m:].mean(1))])[-4:]
            vv = np.concatenate([a for a, _ in probes]); pp = np.concatenate([b for _, b in probes])
            rec["ev"] = explained_variance(torch.tensor(pp), torch.tensor(vv))
            rec["v_sel"] = float(values[chosen].mean())
            sel_ids = [pool_ids[i] for i in chosen]
        R = torch.tensor(rewards, dtype=torch.float64)
        A = group_advantages(R).reshape(-1)
        rec["eff"] = effective_ratio(R); rec["reward"] = float(rewards.mean())
        rec["sel_level"] = float(np.mean([train_rows[pool[i]]["difficulty"] for i in chosen]))
        # policy step
        pol.train()
        seqs = []
        for i, ci in enumerate(chosen):
            for j in range(n):
                a = float(A[i * n + j])
                if abs(a) > 1e-8:
                    seqs.append((pool_ids[ci], responses[i * n + j], a))
        opt.zero_grad(set_to_none=True)
        if seqs:
            width = max(len(p) + len(r) for p, r, _ in seqs)
            inp = torch.full((len(seqs), width), pad, dtype=torch.long); att = torch.zeros_like(inp)
            mask = torch.zeros((len(seqs), width - 1), dtype=torch.bool)
            for row, (p, r, _) in enumerate(seqs):
                L = len(p) + len(r); inp[row, :L] = torch.tensor(p + r); att[row, :L] = 1; mask[row, len(p) - 1:L - 1] = True
            adv = torch.tensor([a for _, _, a in seqs], dtype=torch.float32)
            inp, att, mask, adv = inp.to(dev), att.to(dev), mask.to(dev), adv.to(dev)
            logits = pol(input_ids=inp, attention_mask=att, use_cache=False).logits
            lp = token_logprobs(logits[:, :-1], inp[:, 1:])
            loss = policy_gradient_loss(lp, lp.detach(), adv, mask, num_sequences=m * n)
            loss.backward()
            rec["gnorm"] = float(torch.nn.utils.clip_grad_norm_(pol.parameters(), args.clip))
            opt.step(); sched.step()
        if args.strategy in ("pcl",):
            if args.vprobe:
                vt.train_step(sel_ids + [pool_ids[i] for i in probe], rewards.mean(1).tolist() + allr[m:].mean(1).tolist())
            else:
                vt.train_step(sel_ids, rewards.mean(1).tolist())
        rec["t"] = round(time.time() - t0, 1)
        if step % args.eval_every == 0 or step == args.steps:
            rec.update(evaluate())
            print(json.dumps({k2: (round(v, 3) if isinstance(v, float) else v) for k2, v in rec.items()}), flush=True)
        log.write(json.dumps(rec) + "\n"); log.flush()

def summary(paths):
    for path in paths:
        records = [json.loads(line) for line in open(path)]
        evals = [r for r in records if "eval_t1" in r]
        steps = [r for r in records if "eff" in r]
        acc = [r["eval_t1"] for r in evals]
        at = {r["step"]: r["eval_t1"] - acc[0] for r in evals}
        evs = [r["ev"] for r in steps[len(steps) // 2:] if r.get("ev") is not None]
        print(f"{os.path.basename(path):24s} start {acc[0]:.3f}  gain@200 {at.get(200, float('nan')):+.3f}  "
              f"gain@240 {at.get(240, float('nan')):+.3f}  best {max(acc) - acc[0]:+.3f}  "
              f"eff {np.mean([r['eff'] for r in steps]):.3f}  V EV (2nd half) {np.mean(evs) if evs else float('nan'):.3f}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("cmd", choices=["build", "train", "summary"]); ap.add_argument("paths", nargs="*"); ap.add_argument("--seed", type=int, default=0); ap.add_argument("--out")
    ap.add_argument("--warm-steps", type=int, default=800); ap.add_argument("--model")
    ap.add_argument("--strategy", default="pcl"); ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--vlr", type=float, default=1e-3); ap.add_argument("--tau", type=float, default=0.5)
    ap.add_argument("--k", type=int, default=4); ap.add_argument("--m", type=int, default=64)
    ap.add_argument("--n", type=int, default=8); ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--eval-every", type=int, default=20); ap.add_argument("--eval-size", type=int, default=256)
    ap.add_argument("--max-new", type=int, default=8); ap.add_argument("--clip", type=float, default=1.0)
    ap.add_argument("--device", default="cuda"); ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--probe", type=int, default=32); ap.add_argument("--vprobe", action="store_true")
    a = ap.parse_args()
    {"build": build, "train": train, "summary": lambda a: summary(a.paths)}[a.cmd](a)
