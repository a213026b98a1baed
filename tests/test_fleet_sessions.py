"""serving/sessions.py in a fleet (docs/fleet.md): a named context is the fleet's
ref of that name, so no host makes a context that shadows it, deleting one
deletes that ref, a stored response's ref is read but never changed by a
client, and a turn the fleet refuses leaves nothing behind on its host."""
from __future__ import annotations

import httpx
import pytest

from redis_cluster import redis_cluster  # noqa: F401 (fixture)
from servers import CtxServer, fleet_hosts

SYSTEM = "You are brief."


@pytest.fixture(scope="module")
def hosts(redis_cluster, tmp_path_factory):
    """Two hosts on the session's cluster; each test uses names of its own."""
    with fleet_hosts(tmp_path_factory.mktemp("fleet-sessions"), redis_cluster.url) as started:
        yield started


def post(host: CtxServer, path: str, body: dict) -> httpx.Response:
    return httpx.post(host.url + path, json=body, timeout=120)


def get(host: CtxServer, path: str) -> httpx.Response:
    return httpx.get(host.url + path, timeout=60)


def delete(host: CtxServer, path: str) -> httpx.Response:
    return httpx.delete(host.url + path, timeout=60)


def chat(host: CtxServer, context: str, text: str) -> httpx.Response:
    return post(host, "/v1/chat/completions", {"model": "smollm2", "max_tokens": 4, "temperature": 0,
                                               "messages": [{"role": "user", "content": text}],
                                               "context": context})


def test_a_name_the_fleet_holds_is_not_made_again_on_another_host(hosts):
    # B answered 201 with a context of its own that shadowed the fleet's, and every turn on
    # it generated, then ended in a 409; unnamed contexts were "ctx-1" on every host.
    a, b = hosts
    assert post(a, "/v1/contexts", {"name": "taken", "system": SYSTEM}).status_code == 201
    assert chat(a, "taken", "Name a colour.").status_code == 200  # published: the fleet's ref 'taken'
    made = post(b, "/v1/contexts", {"name": "taken", "system": "Something else."})
    assert made.status_code == 409 and "a context named 'taken' already exists" in made.text, made.text
    assert post(b, "/v1/contexts", {"name": "mine", "system": SYSTEM}).status_code == 201
    assert post(b, "/v1/contexts/mine/fork", {"name": "taken"}).status_code == 409
    assert post(b, "/v1/contexts/taken/restore", {"ref": "mine"}).status_code == 409
    # Restoring the fleet's ref under its own name is reading it, as a request naming it does.
    restored = post(b, "/v1/contexts/taken/restore", {})
    assert restored.status_code == 201, restored.text
    assert restored.json()["snapshot_id"] == get(a, "/v1/contexts/taken").json()["snapshot_id"]
    assert chat(b, "taken", "Another one.").status_code == 200
    unnamed = [post(h, "/v1/contexts", {"system": SYSTEM}).json()["name"] for h in (a, b)]
    assert unnamed[0] != unnamed[1] and all(n.startswith("ctx-") for n in unnamed)


def test_a_deleted_context_is_deleted_on_the_fleet(hosts, redis_cluster):
    # Only the local copy went: the next GET on any host restored it from the fleet's ref.
    a, b = hosts
    assert post(a, "/v1/contexts", {"name": "gone", "system": SYSTEM}).status_code == 201
    assert chat(a, "gone", "Name a colour.").status_code == 200
    d = delete(a, "/v1/contexts/gone")
    assert d.status_code == 200 and d.json()["deleted"] is True
    assert redis_cluster.keys("ctx:r:{gone}") == [] and redis_cluster.keys("ctx:rl:{gone}") == []
    for h in (a, b):
        assert get(h, "/v1/contexts/gone").status_code == 404
    assert post(a, "/v1/contexts/back/restore", {"ref": "gone"}).status_code == 404  # nor A's own ref of it
    assert delete(a, "/v1/contexts/gone").status_code == 404
    assert post(b, "/v1/contexts", {"name": "gone"}).status_code == 201  # the name is free again
    # A host that does not hold it deletes the fleet's ref all the same (no restore first).
    assert post(a, "/v1/contexts", {"name": "far", "system": SYSTEM}).status_code == 201
    assert chat(a, "far", "Name a colour.").status_code == 200
    assert delete(b, "/v1/contexts/far").status_code == 200
    assert redis_cluster.keys("ctx:r:{far}") == [] and get(b, "/v1/contexts/far").status_code == 404


def test_a_context_deleted_on_one_host_is_gone_from_anothers_live_copy(hosts, redis_cluster):
    # B's live copy outlived the delete: B answered from it, and its turn published the
    # deleted conversation again under the freed name.
    a, b = hosts
    assert post(a, "/v1/contexts", {"name": "held", "system": SYSTEM}).status_code == 201
    assert chat(a, "held", "Name a colour.").status_code == 200
    assert chat(b, "held", "Another one.").status_code == 200  # B restores it and holds it live
    assert delete(a, "/v1/contexts/held").status_code == 200
    assert redis_cluster.keys("ctx:rx:{held}") == ["ctx:rx:{held}"]
    turn = chat(b, "held", "And one more.")
    assert turn.status_code == 404 and "deleted on the fleet" in turn.text, turn.text
    assert redis_cluster.keys("ctx:r:{held}") == []
    assert get(b, "/v1/contexts/held").status_code == 404
    # The name is free again, on either host, and a new context under it is published as any.
    assert post(b, "/v1/contexts", {"name": "held", "system": SYSTEM}).status_code == 201
    assert redis_cluster.keys("ctx:rx:{held}") == []
    assert chat(b, "held", "Name a colour.").status_code == 200
    assert get(a, "/v1/contexts/held").status_code == 200


def test_a_turn_running_through_a_delete_does_not_bring_the_context_back(hosts, redis_cluster):
    # B's turn, started before A deleted the context, published on its end: the ref was
    # absent, so the move made it again and the deleted conversation was back on the fleet.
    a, b = hosts
    assert post(a, "/v1/contexts", {"name": "racing", "system": SYSTEM}).status_code == 201
    assert chat(a, "racing", "Name a colour.").status_code == 200
    body = {"model": "smollm2", "max_tokens": 300, "temperature": 0, "stream": True, "context": "racing",
            "messages": [{"role": "user", "content": "Write the numbers from 1 to 300, separated by commas."}]}
    with httpx.stream("POST", b.url + "/v1/chat/completions", json=body, timeout=120) as turn:
        lines = turn.iter_lines()
        assert next(line for line in lines if line.startswith("data: {"))  # B's turn is under way
        assert delete(a, "/v1/contexts/racing").status_code == 200
        rest = list(lines)
    assert sum(line.startswith("data: {") for line in rest) > 100  # the turn went on long after the delete
    error = next(line for line in rest if line.startswith("data: {\"error\""))
    assert "deleted on the fleet" in error and rest.index(error) > 100, rest[-5:]
    assert redis_cluster.keys("ctx:r:{racing}") == [] and redis_cluster.keys("ctx:rx:{racing}")
    for h in (a, b):
        assert get(h, "/v1/contexts/racing").status_code == 404


def test_a_stored_responses_ref_is_read_never_changed(hosts):
    # A chat naming "responses/<id>" restored it, generated and moved the ref on: the response,
    # once made, changed, and its follow-ups continued the injected text.
    a, b = hosts
    r = post(a, "/v1/responses", {"model": "smollm2", "input": "Say hi.", "max_output_tokens": 4, "temperature": 0})
    assert r.status_code == 200, r.text
    rid = r.json()["id"]

    def follow_up() -> dict:
        got = post(b, "/v1/responses", {"model": "smollm2", "input": "Again.", "previous_response_id": rid,
                                        "store": False, "max_output_tokens": 2, "temperature": 0})
        assert got.status_code == 200, got.text
        return got.json()

    before = follow_up()
    card = get(b, f"/v1/contexts/responses/{rid}")  # reading it stays possible
    assert card.status_code == 200, card.text
    refused = chat(b, f"responses/{rid}", "INJECTED")
    assert refused.status_code == 400 and "never changes" in refused.json()["error"]["message"], refused.text
    assert post(b, f"/v1/contexts/responses/{rid}/append", {"text": "INJECTED"}).status_code == 400
    assert post(b, f"/v1/contexts/responses/{rid}/rewind", {"n": 1}).status_code == 400
    assert delete(b, f"/v1/contexts/responses/{rid}").status_code == 400
    after = follow_up()
    assert after["usage"] == before["usage"] and after["output"][0]["content"] == before["output"][0]["content"]
    assert get(a, f"/v1/contexts/responses/{rid}").json()["snapshot_id"] == card.json()["snapshot_id"]


def test_a_turn_the_fleet_refuses_leaves_nothing_behind(hosts):
    # B kept its diverged copy with the refused turn in it: a client retrying the 409 (the
    # openai client does, twice) piled the same user turn onto it again each time.
    a, b = hosts
    post(a, "/v1/contexts", {"name": "split", "system": SYSTEM})
    assert chat(a, "split", "One.").status_code == 200
    assert post(b, "/v1/contexts/split/append", {"text": " Other."}).status_code == 200  # B: S1 and a change
    assert chat(a, "split", "Two.").status_code == 200  # A moves the ref on: B's change cannot follow
    fleets = get(a, "/v1/contexts/split").json()
    refused = chat(b, "split", "MARKER")
    assert refused.status_code == 409 and "ref 'split' was moved on the fleet" in refused.text, refused.text
    card = get(b, "/v1/contexts/split").json()  # restored from the fleet: B's copy went
    assert (card["snapshot_id"], card["n_tokens"], card["text"]) == (fleets["snapshot_id"], fleets["n_tokens"],
                                                                     fleets["text"])
    assert chat(b, "split", "MARKER").status_code == 200  # the retry continues the fleet's
    assert get(a, "/v1/contexts/split").json()["text"].count("MARKER") == 1


def test_the_grpc_face_deletes_on_the_fleet_and_changes_no_stored_response(redis_cluster, tmp_path, hosts):
    # The gRPC face deleted only the local copy (the next Get restored it from the fleet's
    # ref) and appended to, rewound and generated into a stored response's context.
    import grpc

    from ctxengine.rpc import Remote, RemoteError

    a = hosts[0]
    host = CtxServer(tmp_path / "g", "--fleet", redis_cluster.url, "-t", "1", env={"CTX_HOST_ID": "g"})
    try:
        with Remote(host.target) as remote:
            c = remote.create("by-grpc", system=SYSTEM)
            c.append("Name a colour.")
            list(c.generate(max_tokens=2, temperature=0.0))
            assert redis_cluster.keys("ctx:r:{by-grpc}") != []
            c.delete()
            assert redis_cluster.keys("ctx:r:{by-grpc}") == []
            with pytest.raises(RemoteError) as e:
                remote.context("by-grpc")
            assert e.value.code == grpc.StatusCode.NOT_FOUND
            r = post(a, "/v1/responses", {"model": "smollm2", "input": "Say hi.", "max_output_tokens": 2,
                                          "temperature": 0})
            stored = remote.context(f"responses/{r.json()['id']}")  # read: fine
            for change in (lambda: stored.append("INJECTED"), lambda: stored.rewind(1),
                           lambda: list(stored.generate(max_tokens=1)), stored.delete):
                with pytest.raises(RemoteError, match="stored response's") as e:
                    change()
                assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
    finally:
        host.stop()
