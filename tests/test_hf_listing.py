"""hf_listing.read_listing: model_info's JSON answer read, and anything that is not a
repo's listing refused in one line naming the field, before it names a path."""
import pytest

from ctxengine.engine.hf_listing import Listing, read_listing
from ctxengine.errors import CtxError

COMMIT = "3e86bb051872f4aedc379d300fba69ed213d2f35"
SHA = "AB" * 32


def listing(**fields):
    return {"id": "org/repo", "sha": COMMIT, "siblings": [
        {"rfilename": "README.md", "size": 12},
        {"rfilename": "m-Q4_K_M.gguf", "size": 1000, "lfs": {"sha256": SHA, "size": 1000, "pointerSize": 134}},
        {"rfilename": "config.json"}], **fields}


def test_a_listing_gives_the_commit_the_sizes_and_the_lfs_hashes():
    assert read_listing(listing(), "http://hub", "model_info") == Listing(
        COMMIT, {"README.md": 12, "m-Q4_K_M.gguf": 1000, "config.json": None}, {"m-Q4_K_M.gguf": SHA.lower()})


@pytest.mark.parametrize("siblings", [None, []])
def test_a_repo_without_files_lists_none(siblings):
    assert read_listing(listing(siblings=siblings), "http://hub", "model_info") == Listing(COMMIT, {}, {})


@pytest.mark.parametrize("data, says", [
    ([], "not a repo's listing: a JSON list"),
    ("text", "not a repo's listing: a JSON str"),
    (listing(sha=None), "its commit is None"),
    (listing(sha="../../escape"), "its commit is '../../escape'"),
    (listing(sha=COMMIT.upper()), "its commit is"),
    (listing(siblings={"rfilename": "a"}), "its files are a JSON dict, not a list"),
    (listing(siblings={}), "its files are a JSON dict, not a list"),
    (listing(siblings=0), "its files are a JSON int, not a list"),
    (listing(siblings=["a.gguf"]), "a file's entry is 'a.gguf'"),
    (listing(siblings=[{"size": 3}]), "a file's name is None"),
    (listing(siblings=[{"rfilename": ["a"]}]), "a file's name is ['a']"),
    (listing(siblings=[{"rfilename": "a", "size": -1}]), "'a' is -1 bytes"),
    (listing(siblings=[{"rfilename": "a", "size": "10"}]), "'a' is '10' bytes"),
    (listing(siblings=[{"rfilename": "a", "size": True}]), "'a' is True bytes"),
    (listing(siblings=[{"rfilename": "a", "size": 1 << 60}]), f"'a' is {1 << 60} bytes"),
    (listing(siblings=[{"rfilename": "a", "lfs": {"size": 3}}]), "'a' has the sha256 None"),
    (listing(siblings=[{"rfilename": "a", "lfs": {"sha256": "../x"}}]), "'a' has the sha256 '../x'"),
    (listing(siblings=[{"rfilename": "a", "lfs": {"sha256": 5}}]), "'a' has the sha256 5"),
    (listing(siblings=[{"rfilename": "a", "lfs": "ab" * 32}]), "'a' has the LFS entry 'abab"),
    (listing(siblings=[{"rfilename": "x" * 500, "size": -1}]), "'" + "x" * 78 + "… is -1 bytes"),
])
def test_what_is_not_a_listing_is_refused_naming_the_field(data, says):
    with pytest.raises(CtxError) as err:
        read_listing(data, "http://hub", "model_info for org/repo")
    text = str(err.value)
    assert text.startswith("http://hub: the Hub's answer to model_info for org/repo could not be understood (")
    assert says in text and "\n" not in text and len(text) < 300, text
