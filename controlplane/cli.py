"""Command-line client of the Admin service; prints JSON replies.

    python -m controlplane.cli --address HOST:PORT --token T set-floor --bits 4 [--layer L [--expert E]]
    ... clear-floor [--layer L [--expert E]] | floors
    ... pin --layer L --expert E --bits B | unpin --layer L --expert E | pins
    ... set-budget [--dataplane ID] --bytes N | plan --dataplane ID | status

On a gRPC error prints "error: <CODE>: <message>" to stderr and exits 1.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Callable

import grpc
from google.protobuf import json_format
from google.protobuf.message import Message

from pagedweight.v1 import admin_pb2, admin_pb2_grpc

DEFAULT_TIMEOUT_S = 10.0
EXIT_RPC_ERROR = 1


def _scope(args: argparse.Namespace) -> admin_pb2.FloorScope:
    scope = admin_pb2.FloorScope()
    if args.layer is not None:
        scope.layer = args.layer
    if args.expert is not None:
        scope.expert = args.expert
    return scope


# name -> (stub method, request builder)
COMMANDS: dict[str, tuple[str, Callable[[argparse.Namespace], Message]]] = {
    "set-floor": ("SetQualityFloor", lambda a: admin_pb2.SetQualityFloorRequest(
        floor=admin_pb2.QualityFloor(scope=_scope(a), min_bits=a.bits))),
    "clear-floor": ("ClearQualityFloor", lambda a: admin_pb2.ClearQualityFloorRequest(scope=_scope(a))),
    "floors": ("ListQualityFloors", lambda a: admin_pb2.ListQualityFloorsRequest()),
    "pin": ("PinExpert", lambda a: admin_pb2.PinExpertRequest(
        pin=admin_pb2.Pin(layer=a.layer, expert=a.expert, bits=a.bits))),
    "unpin": ("UnpinExpert", lambda a: admin_pb2.UnpinExpertRequest(layer=a.layer, expert=a.expert)),
    "pins": ("ListPins", lambda a: admin_pb2.ListPinsRequest()),
    "set-budget": ("SetMemoryBudget", lambda a: admin_pb2.SetMemoryBudgetRequest(
        dataplane_id=a.dataplane, expert_budget_bytes=a.bytes)),
    "plan": ("GetPlan", lambda a: admin_pb2.GetPlanRequest(dataplane_id=a.dataplane)),
    "status": ("GetStatus", lambda a: admin_pb2.GetStatusRequest()),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m controlplane.cli", description="PagedWeight admin client")
    parser.add_argument("--address", required=True, help="controlplane HOST:PORT")
    parser.add_argument("--token", required=True, help="admin bearer token")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds per call")
    sub = parser.add_subparsers(dest="command", required=True)

    def scoped(p: argparse.ArgumentParser) -> None:
        p.add_argument("--layer", type=int)
        p.add_argument("--expert", type=int, help="needs --layer")

    p = sub.add_parser("set-floor", help="set the minimum bits of a scope (model, layer, expert)")
    p.add_argument("--bits", type=int, required=True)
    scoped(p)
    scoped(sub.add_parser("clear-floor", help="remove the floor of a scope"))
    sub.add_parser("floors", help="list floors")
    p = sub.add_parser("pin", help="hold an expert at fixed bits")
    p.add_argument("--layer", type=int, required=True)
    p.add_argument("--expert", type=int, required=True)
    p.add_argument("--bits", type=int, required=True)
    p = sub.add_parser("unpin", help="remove an expert's pin")
    p.add_argument("--layer", type=int, required=True)
    p.add_argument("--expert", type=int, required=True)
    sub.add_parser("pins", help="list pins")
    p = sub.add_parser("set-budget", help="expert-weight bytes for a dataplane (0 clears)")
    p.add_argument("--dataplane", default="", help="dataplane id; empty = every dataplane")
    p.add_argument("--bytes", type=int, required=True)
    p = sub.add_parser("plan", help="latest plan sent to a dataplane")
    p.add_argument("--dataplane", required=True)
    sub.add_parser("status", help="controlplane and dataplane status")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    method, build = COMMANDS[args.command]
    try:
        request = build(args)
    except ValueError as exc:  # e.g. a negative number for an unsigned field
        print(f"error: INVALID_ARGUMENT: {exc}", file=sys.stderr)
        return EXIT_RPC_ERROR
    with grpc.insecure_channel(args.address) as channel:
        stub = admin_pb2_grpc.AdminStub(channel)
        try:
            reply = getattr(stub, method)(
                request, timeout=args.timeout, metadata=(("authorization", f"Bearer {args.token}"),)
            )
        except grpc.RpcError as exc:
            print(f"error: {exc.code().name}: {exc.details()}", file=sys.stderr)
            return EXIT_RPC_ERROR
    doc = json_format.MessageToDict(
        reply, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
    print(json.dumps(doc, indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
