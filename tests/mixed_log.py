"""A mixed log for tile, window and restore tests: v1 records, then v2 environment and
record leaves of two tenants under two environments (two models, two drivers), appended
through the real writer so bodies and the ``environments`` table are as served."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Callable
from datetime import datetime
from typing import Any

from ledger.checkpoint import Checkpoint, NoteSigner
from ledger.cosignature import Cosigner
from ledger.leaves.commitments import row_commitments
from ledger.leaves.envelope import Leaf
from ledger.leaves.environment import build_environment
from ledger.leaves.record_v2 import EnvironmentRef, build_record_v2, row_data
from ledger.record import AuditRecord
from ledger.store.migrate import upgrade
from ledger.store.sql import SqlLedger
from tests.records import make_record
from tests.vectors.make_leaf_vectors import INPUTS

MODEL_A, MODEL_B = "sha256:" + "a1" * 32, "sha256:" + "b2" * 32
DRIVER_A, DRIVER_B = "560.35.03", "570.86.10"


def stamp(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def environment(i: int, when: datetime, model: str, driver: str) -> Leaf:
    inputs = copy.deepcopy(INPUTS["environment"])
    inputs["record_id"] = f"0192f0c0-0000-7000-8000-{i:012d}"
    inputs["created_at"] = stamp(when)
    inputs["model"]["digest"] = model
    inputs["hardware"]["driver_version"] = driver
    return build_environment(**inputs)


def record_v2(origin: str, i: int, when: datetime, tenant: str, env_index: int,
              env: Leaf) -> Leaf:
    rec: dict[str, Any] = INPUTS["record"]
    commitments = row_commitments(
        input_salt=bytes.fromhex(rec["input_salt"]), output_salt=bytes.fromhex(
            rec["output_salt"]), prompt=f"prompt {i}", input_ids=rec["input_ids"],
        output=f"output {i}", output_ids=rec["output_ids"])
    return build_record_v2(
        origin=origin, tenant=tenant, engine="engine-0",
        environment=EnvironmentRef(env_index, env.leaf_hash), commitments=commitments,
        data=row_data(input_token_count=5, output_token_count=2, truncated=False,
                      finish_reason="stop", rows=2, padded_length=7, padding_side="left",
                      padding_count=2, generation=rec["generation"]),
        batch=rec["batch"], timings_ms=rec["timings_ms"], gpu_sample=None,
        record_id=f"0192f0c0-0000-7000-8000-{i:012d}", created_at=stamp(when))


def mixed_leaves(origin: str, count: int, when: Callable[[int], datetime], v1: int = 0,
                 switch: int | None = None) -> list[AuditRecord | Leaf]:
    """``v1`` v1 records (tenants bank-a/bank-b alternating), then an environment of
    model A and driver A, v2 records of bank-a (even) and bank-b (odd), and at
    ``switch`` an environment of model B and driver B that later records name."""
    leaves: list[AuditRecord | Leaf] = []
    env: Leaf | None = None
    env_index = -1
    for i in range(count):
        tenant = "bank-b" if i % 2 else "bank-a"
        if i < v1:
            leaves.append(make_record(i, tenant=tenant, padding=20,
                                      created_at=stamp(when(i))))
        elif env is None or i == switch:
            model, driver = (MODEL_B, DRIVER_B) if env is not None else (MODEL_A, DRIVER_A)
            env, env_index = environment(i, when(i), model, driver), i
            leaves.append(env)
        else:
            leaves.append(record_v2(origin, i, when(i), tenant, env_index, env))
    return leaves


def append_all(url: str, leaves: list[AuditRecord | Leaf]) -> None:
    """Append through the writer, 64 leaves a group (the database is migrated here)."""
    upgrade(url)
    with SqlLedger(url) as ledger:
        for start in range(0, len(leaves), 64):
            outcomes = asyncio.run(ledger.append_many_async(leaves[start:start + 64]))
            failed = [o for o in outcomes if isinstance(o, BaseException)]
            if failed:
                raise failed[0]


def seal_cosigned(ledger: SqlLedger, origin: str, signer: NoteSigner, witness: Cosigner,
                  size: int) -> None:
    """Name the log, seal its checkpoint (of ``size`` leaves) and store ``witness``'s
    cosignature of it, as a witnessed log publishes it."""
    ledger.create_log_meta(origin, signer.verifier().encode())
    sealed = ledger.seal_checkpoint(signer, origin)
    assert sealed is not None and sealed.size == size
    line = witness.cosign(Checkpoint.peek(sealed.note).body(), 1_790_000_000)
    ledger.cosignatures.store(size, witness.name, line, 1_790_000_000)
