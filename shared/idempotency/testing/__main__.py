"""``python -m shared.idempotency.testing MODULE:NAME`` (``make prove``): a consumer's ``Proof``
run bigger than in its test; the verdict, then one JSON line; exit 1 on a violation, 2 when the
proof cannot be found."""

from __future__ import annotations

import argparse
import importlib
import random
import sys
from dataclasses import replace

from ._terms import Faults
from .proof import STORES, Proof


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m shared.idempotency.testing", description=__doc__)
    parser.add_argument("proof", help="MODULE:NAME, e.g. tests.integration.test_proof:STOCK")
    parser.add_argument("--messages", type=int, default=2000)
    parser.add_argument("--store", choices=STORES, default="table-lean")
    parser.add_argument("--seed", type=int, default=None, help="random unless given (printed to reproduce)")
    parser.add_argument("--fault-rate", type=float, default=Faults().rate)
    parser.add_argument("--outage", type=float, default=0.0, help="seconds the store is down once")
    args = parser.parse_args(argv)
    module, _, name = args.proof.partition(":")
    try:
        proof = getattr(importlib.import_module(module), name or "PROOF")
    except (ImportError, AttributeError) as error:
        print(f"prove: cannot load {args.proof!r}: {error}", file=sys.stderr)
        return 2
    if not isinstance(proof, Proof):
        print(f"prove: {args.proof!r} is a {type(proof).__name__}, not a Proof", file=sys.stderr)
        return 2
    seed = args.seed if args.seed is not None else random.randrange(1_000_000)
    verdict = proof.run(messages=args.messages, store=args.store, seed=seed,
                        faults=replace(Faults(), rate=args.fault_rate, outage=args.outage))  # fmt: skip
    print(verdict)
    print(verdict.line())
    return 0 if verdict.ok else 1


if __name__ == "__main__":
    sys.exit(main())
