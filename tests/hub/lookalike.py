#!/usr/bin/env python3
"""A Hugging Face Hub look-alike on loopback, for tests: the routes, headers,
redirects and errors that the Hub's clients (eeane's, huggingface_hub's) use.

    python3 tests/hub/lookalike.py --repos DIR --port-file FILE [--token TOKEN]

DIR holds one folder per repository, `ORG/NAME/`, each laid out as the files
of a Hub repository, plus an optional `ORG/NAME.json` with
{"gated": true} or {"private": true}. Files the Hub keeps in LFS (by
extension, as .gitattributes does, or over 10 MB) are answered as the Hub
answers them: `resolve` redirects (302) to a second server, the "storage
host", on another port, with X-Linked-Etag (the sha256) and X-Linked-Size.

Routes on the Hub port:
  GET  /api/models/ORG/NAME[/revision/REV][?blobs=true]  model info: sha, siblings
  HEAD|GET /ORG/NAME/resolve/REV/PATH                    a file (Range honoured)
  GET  /_lookalike/log                                   requests seen, for tests
  POST /_lookalike/fault?kind=truncate_once|corrupt&sha=SHA256
Errors carry X-Error-Code (RepoNotFound, RevisionNotFound, EntryNotFound,
GatedRepo) and X-Error-Message, as the Hub sends them; a repository that
does not exist or is private answers 401 without a token, 404 with one.

Writes "HUB_PORT STORAGE_PORT" to --port-file once both listen.
"""
import argparse
import hashlib
import json
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlparse

LFS_SUFFIXES = (".safetensors", ".onnx", ".onnx_data", ".bin", ".model", ".pt", ".h5", ".msgpack", ".ot")
LFS_THRESHOLD = 10 * 1024 * 1024


def git_blob_sha1(data):
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class Repo:
    def __init__(self, repo_id, root, meta):
        self.id = repo_id
        self.gated = bool(meta.get("gated"))
        self.private = bool(meta.get("private"))
        self.files = {}
        for path in sorted(p for p in root.rglob("*") if p.is_file()):
            rel = path.relative_to(root).as_posix()
            size = path.stat().st_size
            is_lfs = rel.endswith(LFS_SUFFIXES) or size > LFS_THRESHOLD
            entry = {"path": path, "size": size, "lfs": is_lfs}
            if is_lfs:
                sha = hashlib.sha256()
                with open(path, "rb") as f:
                    for chunk in iter(lambda: f.read(1 << 20), b""):
                        sha.update(chunk)
                entry["sha256"] = sha.hexdigest()
                pointer = f"version https://git-lfs.github.com/spec/v1\noid sha256:{entry['sha256']}\nsize {size}\n".encode()
                entry["blob_id"] = git_blob_sha1(pointer)
                entry["pointer_size"] = len(pointer)
            else:
                entry["blob_id"] = git_blob_sha1(path.read_bytes())
            self.files[rel] = entry
        # The commit: a hash of the tree, so a changed file makes a new commit.
        tree = "".join(f"{rel} {e['blob_id']}\n" for rel, e in self.files.items())
        self.sha = hashlib.sha1(f"{repo_id}\n{tree}".encode()).hexdigest()

    def tree(self, under, recursive):
        """The Hub's tree listing (one page): files and folders under `under`."""
        prefix = f"{under.strip('/')}/" if under.strip("/") else ""
        entries, folders = [], set()
        for rel, e in self.files.items():
            if not rel.startswith(prefix):
                continue
            rest = rel[len(prefix):]
            if "/" in rest:
                parts = rest.split("/")
                for depth in range(1, len(parts) if recursive else 2):
                    folders.add(prefix + "/".join(parts[:depth]))
                if not recursive:
                    continue
            item = {"type": "file", "oid": e["blob_id"], "size": e["size"], "path": rel}
            if e["lfs"]:
                item["lfs"] = {"oid": e["sha256"], "size": e["size"], "pointerSize": e["pointer_size"]}
            entries.append(item)
        folder_items = [{"type": "directory", "oid": hashlib.sha1(f.encode()).hexdigest(), "size": 0, "path": f} for f in sorted(folders)]
        return folder_items + entries

    def info(self, with_blobs):
        siblings = []
        for rel, e in self.files.items():
            s = {"rfilename": rel}
            if with_blobs:
                s["blobId"] = e["blob_id"]
                s["size"] = e["size"]
                if e["lfs"]:
                    s["lfs"] = {"sha256": e["sha256"], "size": e["size"], "pointerSize": e["pointer_size"]}
            siblings.append(s)
        return {
            "_id": hashlib.sha1(self.id.encode()).hexdigest()[:24],
            "id": self.id,
            "modelId": self.id,
            "sha": self.sha,
            "private": self.private,
            "gated": "manual" if self.gated else False,
            "disabled": False,
            "tags": [],
            "siblings": siblings,
        }


class State:
    def __init__(self, repos_dir, token):
        self.token = token
        self.repos = {}
        for meta_or_dir in sorted(repos_dir.glob("*/*")):
            if meta_or_dir.is_dir():
                repo_id = meta_or_dir.relative_to(repos_dir).as_posix()
                meta_file = meta_or_dir.with_suffix(".json")
                meta = json.loads(meta_file.read_text()) if meta_file.exists() else {}
                self.repos[repo_id] = Repo(repo_id, meta_or_dir, meta)
        self.by_sha256 = {e["sha256"]: e for r in self.repos.values() for e in r.files.values() if e["lfs"]}
        self.log = []
        self.faults = {}
        self.lock = threading.Lock()
        self.storage_port = None

    def record(self, server, handler):
        with self.lock:
            self.log.append({
                "server": server,
                "method": handler.command,
                "path": handler.path,
                "authorization": handler.headers.get("Authorization") is not None,
                "range": handler.headers.get("Range"),
            })


def parse_range(header, size):
    """(start, end inclusive) of a `bytes=a-b` or `bytes=a-` header, or None."""
    if not header or not header.startswith("bytes="):
        return None
    first, _, last = header[len("bytes="):].split(",")[0].partition("-")
    start = int(first) if first else max(0, size - int(last))
    end = int(last) if first and last else size - 1
    return start, min(end, size - 1)


def send_file(handler, path, size, head_only, extra_headers, fault=None):
    rng = parse_range(handler.headers.get("Range"), size)
    start, end = rng if rng else (0, size - 1)
    if rng and start >= size:
        handler.send_response(416)
        handler.send_header("Content-Range", f"bytes */{size}")
        handler.send_header("Content-Length", "0")
        handler.end_headers()
        return
    handler.send_response(206 if rng else 200)
    for k, v in extra_headers.items():
        handler.send_header(k, v)
    handler.send_header("Accept-Ranges", "bytes")
    handler.send_header("Content-Length", str(end - start + 1))
    if rng:
        handler.send_header("Content-Range", f"bytes {start}-{end}/{size}")
    handler.end_headers()
    if head_only:
        return
    with open(path, "rb") as f:
        f.seek(start)
        data = f.read(end - start + 1)
    if fault == "corrupt" and data:
        data = bytes([data[0] ^ 0xFF]) + data[1:]
    if fault == "truncate_once":
        # Half the bytes, then the connection drops.
        handler.wfile.write(data[: len(data) // 2])
        handler.wfile.flush()
        handler.close_connection = True
        handler.connection.shutdown(2)
        return
    handler.wfile.write(data)


def make_hub_handler(state):
    class Hub(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def error(self, status, code, message):
            body = json.dumps({"error": message}).encode()
            self.send_response(status)
            if code:
                self.send_header("X-Error-Code", code)
            self.send_header("X-Error-Message", message)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def send_json(self, value, head_only):
            body = json.dumps(value).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if not head_only:
                self.wfile.write(body)

        def authorized(self):
            return self.headers.get("Authorization") == f"Bearer {state.token}"

        def repo(self, repo_id):
            """The repository, or None after answering the Hub's error for it."""
            repo = state.repos.get(repo_id)
            if repo is None or (repo.private and not self.authorized()):
                if self.authorized():
                    self.error(404, "RepoNotFound", f"Repository Not Found for url: {self.path}.")
                else:
                    self.error(401, "RepoNotFound", f"Repository Not Found for url: {self.path}. Please make sure you specified the correct `repo_id` and `repo_type`. If you are trying to access a private or gated repo, make sure you are authenticated.")
                return None
            if repo.gated and not self.authorized():
                self.error(401, "GatedRepo", f"Access to model {repo_id} is restricted. You must have access to it and be authenticated to access it. Please log in.")
                return None
            return repo

        def revision_ok(self, repo, revision):
            if revision in ("main", repo.sha):
                return True
            self.error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
            return False

        def do_POST(self):
            state.record("hub", self)
            url = urlparse(self.path)
            if url.path == "/_lookalike/fault":
                q = parse_qs(url.query)
                with state.lock:
                    state.faults[q["sha"][0]] = q["kind"][0]
                self.send_response(204)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self.error(404, None, "Not Found")

        def do_HEAD(self):
            self.do_GET(head_only=True)

        def do_GET(self, head_only=False):
            url = urlparse(self.path)
            path = unquote(url.path)
            if path == "/_lookalike/log":
                with state.lock:
                    log = list(state.log)
                self.send_json(log, head_only)
                return
            state.record("hub", self)
            parts = path.strip("/").split("/")
            if parts[:2] == ["api", "models"] and len(parts) >= 6 and parts[4] == "tree":
                repo_id, revision, under = "/".join(parts[2:4]), parts[5], "/".join(parts[6:])
                repo = self.repo(repo_id)
                if repo is None or not self.revision_ok(repo, revision):
                    return
                recursive = "recursive=true" in url.query.lower() or "recursive=1" in url.query
                self.send_json(repo.tree(under, recursive), head_only)
                return
            if parts[:2] == ["api", "models"] and len(parts) >= 4:
                repo_id = "/".join(parts[2:4])
                revision = parts[5] if len(parts) >= 6 and parts[4] == "revision" else "main"
                repo = self.repo(repo_id)
                if repo is None or not self.revision_ok(repo, revision):
                    return
                self.send_json(repo.info("blobs=true" in url.query), head_only)
                return
            if len(parts) >= 5 and parts[2] == "resolve":
                repo_id, revision, rel = "/".join(parts[:2]), parts[3], "/".join(parts[4:])
                repo = self.repo(repo_id)
                if repo is None or not self.revision_ok(repo, revision):
                    return
                entry = repo.files.get(rel)
                if entry is None:
                    self.error(404, "EntryNotFound", f"{rel} does not exist on \"{revision}\"")
                    return
                headers = {"X-Repo-Commit": repo.sha, "ETag": f'"{entry["blob_id"]}"'}
                if entry["lfs"]:
                    headers["X-Linked-Etag"] = f'"{entry["sha256"]}"'
                    headers["X-Linked-Size"] = str(entry["size"])
                    headers["Location"] = f"http://127.0.0.1:{state.storage_port}/lfs/{entry['sha256']}?repo={repo_id}"
                    self.send_response(302)
                    for k, v in headers.items():
                        self.send_header(k, v)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                send_file(self, entry["path"], entry["size"], head_only, headers)
                return
            self.error(404, None, "Not Found")

    return Hub


def make_storage_handler(state):
    class Storage(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def do_HEAD(self):
            self.do_GET(head_only=True)

        def do_GET(self, head_only=False):
            state.record("storage", self)
            parts = urlparse(self.path).path.strip("/").split("/")
            entry = state.by_sha256.get(parts[-1]) if parts[:1] == ["lfs"] else None
            if entry is None:
                self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            with state.lock:
                fault = state.faults.get(entry["sha256"])
                if fault == "truncate_once" and not head_only:
                    del state.faults[entry["sha256"]]
            send_file(self, entry["path"], entry["size"], head_only, {"ETag": f'"{entry["sha256"]}"'}, None if head_only else fault)

    return Storage


class Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):
        # A client that drops its connection mid-transfer (or a fault cut it) is expected.
        pass


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repos", type=Path, required=True)
    parser.add_argument("--port-file", type=Path, required=True)
    parser.add_argument("--token", default="hf_lookalike_token")
    args = parser.parse_args()
    state = State(args.repos, args.token)
    storage = Server(("127.0.0.1", 0), make_storage_handler(state))
    hub = Server(("127.0.0.1", 0), make_hub_handler(state))
    state.storage_port = storage.server_address[1]
    threading.Thread(target=storage.serve_forever, daemon=True).start()
    tmp = args.port_file.with_suffix(".tmp")
    tmp.write_text(f"{hub.server_address[1]} {storage.server_address[1]}\n")
    os.replace(tmp, args.port_file)
    hub.serve_forever()


if __name__ == "__main__":
    main()
