"""The ``sessions`` and ``rules`` commands on both stores: what they change, graphs read."""

from __future__ import annotations

from merlin_torch_serving.cli import main
from merlin_torch_serving.stores import RedisSettings, Store, open_store


def location(store) -> list[str]:
    if isinstance(store, RedisSettings):
        return ["--store", store.url, "--key-prefix", store.key_prefix]
    return ["--store", store.folder]


def test_rules_block_unblock_and_show_change_the_list_graphs_read(store, capsys):
    where = location(store)
    assert main(["rules", "block", *where, "--list", "stock", "12", "7"]) == 0
    assert main(["rules", "block", *where, "--list", "market", "1"]) == 0
    assert main(["rules", "unblock", *where, "--list", "stock", "7"]) == 0
    capsys.readouterr()
    assert main(["rules", "show", *where]) == 0
    assert capsys.readouterr().out.splitlines() == ["market\t1", "stock\t1"]
    assert main(["rules", "show", *where, "--list", "stock"]) == 0
    assert capsys.readouterr().out.splitlines() == ["12"]


def test_sessions_forget_erases_a_session(store, capsys):
    from merlin_torch_serving.stores import Click

    opened: Store
    with open_store(store) as opened:
        opened.append({"42": [Click(b"k", 1.0, b"row")]}, keep=5, ttl_s=600)
    where = location(store)
    assert main(["sessions", "show", *where, "42"]) == 0
    assert main(["sessions", "forget", *where, "42", "43"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "42: 1 stored click(s)",
        "42: forgotten",
        "43: nothing stored",
    ]
    with open_store(store) as opened:
        assert opened.clicks("42") == []


def test_an_unreachable_store_is_an_error_naming_it(tmp_path, capsys):
    blocked = tmp_path / "file"
    blocked.write_text("not a folder")
    assert main(["rules", "show", "--store", str(blocked / "store")]) == 1
    assert "error: the store at " in capsys.readouterr().err


def test_a_password_on_the_command_line_is_refused_without_repeating_it(capsys):
    assert main(["rules", "show", "--store", "redis://:pw@localhost:1/0"]) == 1
    error = capsys.readouterr().err
    assert "redis://:***@localhost:1/0" in error
    assert "password_env" in error
    assert ":pw@" not in error
