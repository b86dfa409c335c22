"""The commands over a store of live sessions, rules and trending counts:

merlin-torch-serving sessions forget --store STORE SESSION...   erase what is stored of sessions
merlin-torch-serving sessions show --store STORE SESSION        a session's stored clicks (count)
merlin-torch-serving rules block --store STORE --list NAME ITEM...
merlin-torch-serving rules unblock --store STORE --list NAME ITEM...
merlin-torch-serving rules show --store STORE [--list NAME]     a list's items, or every list

STORE is a folder (the embedded store) or a Redis URL (redis://, rediss://, unix://); a password
comes from the environment variable --password-env names, never from the command line.
"""

from __future__ import annotations

import argparse
import urllib.parse

from merlin_torch_serving.exceptions import StoreError
from merlin_torch_serving.stores import Store, open_store
from merlin_torch_serving.stores.settings import REDIS_SCHEMES, redact


def add_store_commands(commands, common: argparse.ArgumentParser) -> None:
    """The ``sessions`` and ``rules`` commands, added to ``commands`` (the parser's subparsers)."""
    store = argparse.ArgumentParser(add_help=False)
    store.add_argument(
        "--store",
        required=True,
        help="a folder (the embedded store) or a Redis URL: redis://, rediss:// (TLS), unix://",
    )
    store.add_argument(
        "--password-env", metavar="VARIABLE", help="the environment variable holding the password"
    )
    store.add_argument("--ca-file", help="rediss: the CA that signed the server's certificate")
    store.add_argument(
        "--key-prefix", default="mts", help="the key prefix the graph was exported with"
    )
    store.add_argument(
        "--timeout", type=float, default=5.0, metavar="SECONDS", help="per call to the store"
    )

    sessions = commands.add_parser(
        "sessions", parents=[common], help="erase or show what a store keeps of sessions"
    )
    session_actions = sessions.add_subparsers(dest="action", required=True)
    forget = session_actions.add_parser(
        "forget", parents=[store], help="remove everything stored of the sessions"
    )
    forget.add_argument("session_ids", nargs="+", metavar="SESSION")
    forget.set_defaults(run=forget_sessions)
    show = session_actions.add_parser("show", parents=[store], help="how many clicks a session has")
    show.add_argument("session_id", metavar="SESSION")
    show.set_defaults(run=show_session)

    rules = commands.add_parser(
        "rules", parents=[common], help="change the block lists graphs read while they serve"
    )
    rule_actions = rules.add_subparsers(dest="action", required=True)
    for action, run, help_text in (
        ("block", block_items, "add raw item ids to a block list"),
        ("unblock", unblock_items, "take raw item ids off a block list"),
    ):
        sub = rule_actions.add_parser(action, parents=[store], help=help_text)
        sub.add_argument("--list", dest="rule_list", default="blocked", help="the list's name")
        sub.add_argument("items", nargs="+", metavar="ITEM")
        sub.set_defaults(run=run)
    show_rules = rule_actions.add_parser(
        "show", parents=[store], help="the items of a block list, or every list and its size"
    )
    show_rules.add_argument("--list", dest="rule_list", default=None, help="the list's name")
    show_rules.set_defaults(run=show_block_lists)


def opened(args) -> Store:
    options: dict = {"timeout_s": args.timeout}
    if urllib.parse.urlsplit(args.store).scheme in REDIS_SCHEMES:
        options.update(
            password_env=args.password_env,
            ca_file=args.ca_file,
            key_prefix=args.key_prefix,
            connect_timeout_s=args.timeout,
        )
    try:
        return open_store(args.store, **options)
    except ValueError as error:  # a location or option that cannot name a store
        raise StoreError(redact(args.store), "it cannot be used as given", str(error)) from error


def forget_sessions(args) -> int:
    with opened(args) as store:
        for session in args.session_ids:
            found = store.forget(session)
            print(f"{session}: {'forgotten' if found else 'nothing stored'}")
    return 0


def show_session(args) -> int:
    with opened(args) as store:
        print(f"{args.session_id}: {len(store.clicks(args.session_id))} stored click(s)")
    return 0


def block_items(args) -> int:
    with opened(args) as store:
        added = store.block(args.rule_list, args.items)
        total = len(store.blocked(args.rule_list))
        print(f"{args.rule_list}: {added} item(s) blocked, {total} in all")
    return 0


def unblock_items(args) -> int:
    with opened(args) as store:
        removed = store.unblock(args.rule_list, args.items)
        left = len(store.blocked(args.rule_list))
        print(f"{args.rule_list}: {removed} item(s) unblocked, {left} left")
    return 0


def show_block_lists(args) -> int:
    with opened(args) as store:
        if args.rule_list is not None:
            for item in store.blocked(args.rule_list):
                print(item)
            return 0
        for name in store.rule_lists():
            print(f"{name}\t{len(store.blocked(name))}")
    return 0
