"""The built-in procedural families (seeded, unlimited instances).

Instructions are short and reference solutions are plain shell, so that a tiny
byte-level model can learn them. Families with `turns >= 2` hide a value the agent must
read in the sandbox (a file name, an error message) before it can act: the reference
solution's later turns contain that value, and the instruction does not.
"""

from __future__ import annotations

import gzip
import io
import json
import random
import tarfile

from terminal_rsi.sandbox.base import files_to_tar
from terminal_rsi.tasks.builtin.core import (
    WORDS,
    Family,
    Instance,
    check,
    join_lines,
    lines,
    pick,
    sh_quote,
    text_eq,
)

# ----------------------------------------------------------------------------- 1 create_file


def gen_create_file(rng: random.Random) -> Instance:
    name = f"{rng.choice(WORDS)}.txt"
    text = " ".join(pick(rng, WORDS, 3))
    return Instance(
        instruction=f"Create a file {name} containing the line: {text}",
        files={},
        solution=[[f"echo '{text}' > {name}"]],
        # right file, but a stray file left behind: P = N = 1, hygiene fails, S = 0
        partial=[f"echo '{text}' > {name}; echo draft > {name}.bak"],
        checks=lambda s, run: [check(f"{name} has the requested line", text_eq(s, name, text))],
        outputs=(name,),
    )


# ----------------------------------------------------------------------------- 2 edit_replace


def gen_edit_replace(rng: random.Random) -> Instance:
    old, new, filler = pick(rng, WORDS, 3)
    n = rng.randint(4, 7)
    rows = []
    for i in range(n):
        k = rng.randint(1, 2)
        rows.append(" ".join([old] * k + [filler, str(i)]))
    rows.insert(rng.randint(0, n), f"keep {filler} line")
    src = "\n".join(rows) + "\n"
    want = src.replace(old, new)
    count = want.count(new)
    keep = [r for r in rows if old not in r]

    def checks(s, run):
        got = s.text("notes.txt") or ""
        return [
            check(f"no '{old}' left", old not in got and got != ""),
            check(f"'{new}' appears {count} times", got.count(new) == count),
            check("other lines kept", all(k in got.splitlines() for k in keep) and
                  len(got.splitlines()) == len(rows)),
        ]

    return Instance(
        instruction=f"In notes.txt replace every '{old}' with '{new}'.",
        files={"notes.txt": src.encode()},
        solution=[[f"sed -i 's/{old}/{new}/g' notes.txt"]],
        partial=[f"sed -i '1,2s/{old}/{new}/g' notes.txt"],
        checks=checks,
        mutable=("notes.txt",),
    )


# ----------------------------------------------------------------------------- 3 count_lines


def gen_count_lines(rng: random.Random) -> Instance:
    levels = ["INFO", "WARN", "ERROR"]
    n = rng.randint(8, 20)
    rows = [f"{rng.choice(levels)} {rng.choice(WORDS)} {rng.randint(1, 99)}" for _ in range(n)]
    rows[0] = "ERROR " + rows[0].split(" ", 1)[1]
    err = sum(r.startswith("ERROR") for r in rows)
    return Instance(
        instruction="Write the number of lines of app.log that contain ERROR to errors.txt "
                    "and the total number of lines to total.txt.",
        files={"app.log": join_lines(rows)},
        solution=[["grep -c ERROR app.log > errors.txt", "wc -l < app.log > total.txt"]],
        partial=["wc -l < app.log > total.txt"],
        checks=lambda s, run: [
            check("errors.txt is the ERROR count", text_eq(s, "errors.txt", str(err))),
            check("total.txt is the line count", text_eq(s, "total.txt", str(n))),
        ],
        outputs=("errors.txt", "total.txt"),
    )


# ----------------------------------------------------------------------------- 4 sort_uniq


def gen_sort_uniq(rng: random.Random) -> Instance:
    vocab = pick(rng, WORDS, rng.randint(4, 7))
    counts = {w: rng.randint(1, 4) for w in vocab}
    top = rng.choice(vocab)
    counts[top] = 6
    words = [w for w, c in counts.items() for _ in range(c)]
    rng.shuffle(words)
    distinct = sorted(vocab)
    return Instance(
        instruction="words.txt has one word per line. Write the distinct words, sorted, to "
                    "sorted.txt, the most frequent word to top.txt, and the number of "
                    "distinct words to distinct.txt.",
        files={"words.txt": join_lines(words)},
        solution=[["sort -u words.txt > sorted.txt",
                   "sort words.txt | uniq -c | sort -rn | head -1 | awk '{print $2}' > top.txt",
                   "sort -u words.txt | wc -l > distinct.txt"]],
        partial=["sort -u words.txt > sorted.txt"],
        checks=lambda s, run: [
            check("sorted.txt has the distinct words in order", lines(s, "sorted.txt") == distinct),
            check("top.txt has the most frequent word", text_eq(s, "top.txt", top)),
            check("distinct.txt has the distinct count", text_eq(s, "distinct.txt",
                                                                 str(len(distinct)))),
        ],
        outputs=("sorted.txt", "top.txt", "distinct.txt"),
    )


# ----------------------------------------------------------------------------- 5 column_sum


def gen_column_sum(rng: random.Random) -> Instance:
    n = rng.randint(4, 9)
    items = pick(rng, WORDS, n)
    rows = [(w, rng.randint(1, 20), rng.randint(1, 9)) for w in items]
    qty = sum(q for _, q, _ in rows)
    rev = sum(q * p for _, q, p in rows)
    csv = "item,qty,price\n" + "".join(f"{w},{q},{p}\n" for w, q, p in rows)
    return Instance(
        instruction="sales.csv has columns item,qty,price. Write the sum of qty to qty.txt "
                    "and the sum of qty*price to revenue.txt.",
        files={"sales.csv": csv.encode()},
        solution=[["awk -F, 'NR>1{s+=$2} END{print s}' sales.csv > qty.txt",
                   "awk -F, 'NR>1{s+=$2*$3} END{print s}' sales.csv > revenue.txt"]],
        partial=["awk -F, 'NR>1{s+=$2} END{print s}' sales.csv > qty.txt"],
        checks=lambda s, run: [
            check("qty.txt is the qty sum", text_eq(s, "qty.txt", str(qty))),
            check("revenue.txt is the revenue", text_eq(s, "revenue.txt", str(rev))),
        ],
        outputs=("qty.txt", "revenue.txt"),
    )


# ----------------------------------------------------------------------------- 6 find_tree


def gen_find_tree(rng: random.Random) -> Instance:
    ext = rng.choice(["log", "csv", "md"])
    other = [e for e in ("txt", "dat", "cfg") if e != ext]
    files: dict[str, bytes] = {}
    dirs = ["tree"] + [f"tree/{a}" for a in pick(rng, WORDS, 3)]
    dirs += [f"{d}/{rng.choice(WORDS)}" for d in dirs[1:3]]
    hits = set()
    k = rng.randint(3, 8)
    while len(hits) < k:
        hits.add(f"{rng.choice(dirs)}/{rng.choice(WORDS)}.{ext}")
    for p in hits:
        files[p] = b"x\n"
    for _ in range(rng.randint(3, 6)):
        files[f"{rng.choice(dirs)}/{rng.choice(WORDS)}.{rng.choice(other)}"] = b"y\n"
    want = sorted(hits)

    def checks(s, run):
        got = lines(s, "found.txt") or []
        out = [check(f"lists {p}", p in got) for p in want]
        out.append(check(f"lists only .{ext} files", got != [] and set(got) <= set(want)))
        return out

    return Instance(
        instruction=f"Find every .{ext} file under tree/ and write their paths, sorted, one "
                    "per line, to found.txt.",
        files=files,
        solution=[[f"find tree -type f -name '*.{ext}' | sort > found.txt"]],
        partial=[f"find tree -type f -name '*.{ext}' | sort | head -1 > found.txt"],
        checks=checks,
        outputs=("found.txt",),
        variant=f".{ext}",
    )


# ----------------------------------------------------------------------------- 7 json_extract


def gen_json_extract(rng: random.Random) -> Instance:
    cities = pick(rng, ["oslo", "lima", "rome", "kyiv", "baku"], 3)
    names = pick(rng, WORDS, rng.randint(5, 9))
    users = [{"name": n, "age": rng.randint(18, 70), "city": rng.choice(cities)} for n in names]
    limit = sorted(u["age"] for u in users)[len(users) // 2]
    city = users[0]["city"]
    older = sorted(u["name"] for u in users if u["age"] > limit)
    in_city = sum(u["city"] == city for u in users)
    mean = sum(u["age"] for u in users) // len(users)
    py = "python3 -c \"import json; u=json.load(open('users.json')); {}\""
    return Instance(
        instruction=f"users.json is a list of users with name, age and city. Write the names "
                    f"of users older than {limit}, sorted, one per line, to older.txt; the "
                    f"number of users in {city} to city.txt; and the mean age, rounded down, "
                    "to mean.txt.",
        files={"users.json": json.dumps(users, indent=1).encode()},
        solution=[[
            py.format(f"print(*sorted(x['name'] for x in u if x['age'] > {limit}), sep='\\n')")
            + " > older.txt",
            py.format(f"print(sum(x['city'] == '{city}' for x in u))") + " > city.txt",
            py.format("print(sum(x['age'] for x in u) // len(u))") + " > mean.txt",
        ]],
        partial=[py.format(f"print(sum(x['city'] == '{city}' for x in u))") + " > city.txt"],
        checks=lambda s, run: [
            check("older.txt lists the older users", lines(s, "older.txt") == older),
            check("city.txt has the city count", text_eq(s, "city.txt", str(in_city))),
            check("mean.txt has the mean age", text_eq(s, "mean.txt", str(mean))),
        ],
        outputs=("older.txt", "city.txt", "mean.txt"),
    )


# ----------------------------------------------------------------------------- 8 csv_filter


def gen_csv_filter(rng: random.Random) -> Instance:
    depts = pick(rng, ["ops", "dev", "qa", "hr", "sales"], 3)
    target = depts[0]
    names = pick(rng, WORDS, rng.randint(6, 12))
    rows = [(n, rng.choice(depts), rng.randint(30, 90)) for n in names]
    rows[0] = (rows[0][0], target, rows[0][2])
    rows[1] = (rows[1][0], depts[1], rows[1][2])
    header = "name,dept,salary"
    text = header + "\n" + "".join(f"{a},{b},{c}\n" for a, b, c in rows)
    want = [f"{a},{b},{c}" for a, b, c in rows if b == target]

    def checks(s, run):
        got = lines(s, "out.csv") or []
        body = got[1:]
        return [
            check("out.csv starts with the header", got[:1] == [header]),
            check(f"out.csv has {len(want)} data rows", len(body) == len(want)),
            check(f"every {target} row is kept, in order", body == want),
            check(f"only {target} rows", all(r.split(",")[1:2] == [target] for r in body)),
        ]

    return Instance(
        instruction=f"people.csv has columns name,dept,salary. Write the header and the rows "
                    f"whose dept is {target} to out.csv, in the original order.",
        files={"people.csv": text.encode()},
        solution=[[f"awk -F, 'NR==1 || $2==\"{target}\"' people.csv > out.csv"]],
        partial=["head -1 people.csv > out.csv"],
        checks=checks,
        outputs=("out.csv",),
    )


# ----------------------------------------------------------------------------- 9 config_edit


def gen_config_edit(rng: random.Random) -> Instance:
    keys = pick(rng, ["port", "debug", "workers", "timeout", "level", "cache", "host"], 6)
    vals = {k: str(rng.randint(1, 99)) for k in keys}
    k_change = rng.randint(2, 4)
    changes = {k: str(int(vals[k]) + rng.randint(1, 50)) for k in keys[:k_change]}
    text = "# app settings\n" + "".join(f"{k}={v}\n" for k, v in vals.items())
    spec = " and ".join(f"{k} to {v}" for k, v in changes.items())

    def checks(s, run):
        got = lines(s, "app.conf") or []
        kv = {}
        dup = False
        for ln in got:
            if "=" in ln and not ln.startswith("#"):
                k, _, v = ln.partition("=")
                dup |= k.strip() in kv
                kv[k.strip()] = v.strip()
        out = [check(f"{k} is {v}", kv.get(k) == v) for k, v in changes.items()]
        out.append(check("other settings kept", all(kv.get(k) == vals[k] for k in keys[k_change:])
                         and "# app settings" in got))
        out.append(check("each key once", not dup and len(kv) == len(keys)))
        return out

    first = keys[0]
    return Instance(
        instruction=f"In app.conf set {spec}. Keep every other line.",
        files={"app.conf": text.encode()},
        solution=[[f"sed -i 's/^{k}=.*/{k}={v}/' app.conf" for k, v in changes.items()]],
        partial=[f"sed -i 's/^{first}=.*/{first}={changes[first]}/' app.conf"],
        checks=checks,
        mutable=("app.conf",),
        variant=f"{k_change} keys",
    )


# ----------------------------------------------------------------------------- 10 permissions


def gen_permissions(rng: random.Random) -> Instance:
    scripts = [f"bin/{w}.sh" for w in pick(rng, WORDS, rng.randint(2, 5))]
    docs = [f"bin/{w}.txt" for w in pick(rng, WORDS, 2)]
    files = {p: b"#!/bin/sh\necho hi\n" for p in scripts}
    files.update({p: b"notes\n" for p in docs})
    files["secret.key"] = f"{rng.getrandbits(64):016x}\n".encode()

    def mode(s, p):
        e = s.get(p)
        return e.mode if e is not None and e.kind == "file" else None

    def checks(s, run):
        out = [check(f"{p} is executable by its owner", (mode(s, p) or 0) & 0o100)
               for p in scripts]
        out.append(check("secret.key has mode 600", mode(s, "secret.key") == 0o600))
        out.append(check(".txt files are not executable",
                         all(mode(s, p) is not None and not mode(s, p) & 0o111 for p in docs)))
        return out

    return Instance(
        instruction="Make every .sh file in bin/ executable by its owner, and give secret.key "
                    "mode 600 (owner read/write only).",
        files=files,
        solution=[["chmod u+x bin/*.sh", "chmod 600 secret.key"]],
        partial=["chmod 600 secret.key"],
        checks=checks,
        mutable=("secret.key",),
    )


# ----------------------------------------------------------------------------- 11 archive


def gen_archive(rng: random.Random) -> Instance:
    docs = {f"docs/{w}.txt": f"{w} {rng.randint(0, 999)}\n".encode()
            for w in pick(rng, WORDS, rng.randint(2, 5))}
    other = {"notes.txt": b"not part of the backup\n"}
    files = {**docs, **other}

    def members(s):
        e = s.get("backup.tar.gz")
        if e is None or e.kind != "file" or e.data[:2] != b"\x1f\x8b":
            return None
        try:
            with tarfile.open(fileobj=io.BytesIO(e.data), mode="r:gz") as tf:
                return {m.name.removeprefix("./"): tf.extractfile(m).read()
                        for m in tf.getmembers() if m.isreg()}
        except (tarfile.TarError, OSError, EOFError):
            return None

    def checks(s, run):
        m = members(s)
        out = [check("backup.tar.gz is a gzip tar archive", m is not None)]
        m = m or {}
        out += [check(f"archive holds {p}", m.get(p) == d) for p, d in docs.items()]
        out.append(check("archive holds only docs/", m != {} and all(p.startswith("docs/")
                                                                      for p in m)))
        return out

    first = sorted(docs)[0]
    return Instance(
        instruction="Create backup.tar.gz, a gzip-compressed tar archive of the docs/ "
                    "directory (paths inside start with docs/).",
        files=files,
        solution=[["tar czf backup.tar.gz docs"]],
        partial=[f"tar czf backup.tar.gz {first}"],
        checks=checks,
        outputs=("backup.tar.gz",),
    )


# ----------------------------------------------------------------------------- 12 batch_rename


def gen_batch_rename(rng: random.Random) -> Instance:
    k = rng.randint(19, 25)
    names = [f"{w}{i}" for i, w in enumerate(rng.choices(WORDS, k=k))]
    files = {f"inbox/{n}.txt": f"{n}\n".encode() for n in names}

    def checks(s, run):
        out = [check(f"inbox/{n}.md exists", s.files().get(f"inbox/{n}.md") == f"{n}\n".encode())
               for n in names]
        out.append(check("no .txt left in inbox/",
                         not any(p.startswith("inbox/") and p.endswith(".txt") for p in s)))
        return out

    return Instance(
        instruction="Rename every .txt file in inbox/ to the same name ending in .md.",
        files=files,
        solution=[['for f in inbox/*.txt; do mv "$f" "${f%.txt}.md"; done']],
        partial=[f"mv inbox/{names[0]}.txt inbox/{names[0]}.md"],
        checks=checks,
        outputs=tuple(f"inbox/{n}.md" for n in names),
        mutable=tuple(files),
    )


# ----------------------------------------------------------------------------- 13 log_pipeline


def gen_log_pipeline(rng: random.Random) -> Instance:
    codes = sorted(rng.sample([200, 201, 204, 301, 302, 400, 403, 404, 500, 503],
                              rng.randint(3, 6)))
    n = rng.randint(15, 40)
    rows = [f"10.0.0.{rng.randint(1, 9)} GET /{rng.choice(WORDS)} {rng.choice(codes)}"
            for _ in range(n)]
    for i, c in enumerate(codes):
        rows[i] = rows[i].rsplit(" ", 1)[0] + f" {c}"
    counts = {c: sum(r.endswith(f" {c}") for r in rows) for c in codes}
    want = [f"{c} {counts[c]}" for c in codes]

    def checks(s, run):
        got = lines(s, "report.txt") or []
        norm = [" ".join(x.split()) for x in got]
        out = [check(f"line for status {c}", f"{c} {counts[c]}" in norm) for c in codes]
        out.append(check("lines sorted by status", norm == sorted(norm, key=lambda x: x.split()[0])
                         and norm != []))
        out.append(check("one line per status", norm != [] and set(norm) <= set(want)))
        return out

    return Instance(
        instruction="Each line of access.log is: IP METHOD PATH STATUS. Write report.txt with "
                    "one line 'STATUS COUNT' per status code, sorted by status.",
        files={"access.log": join_lines(rows)},
        solution=[["awk '{print $4}' access.log | sort | uniq -c | "
                   "awk '{print $2, $1}' | sort -n > report.txt"]],
        partial=["awk '{print $4}' access.log | sort | uniq -c | "
                 "awk '{print $2, $1}' | sort -n | head -2 > report.txt"],
        checks=checks,
        outputs=("report.txt",),
    )


# ----------------------------------------------------------------------------- 14 unpack


def _tar_gz(members: dict[str, bytes]) -> bytes:
    """A gzip tar of regular files only (no directory entries), byte-identical per input."""
    return gzip.compress(files_to_tar(members, mtime=0), mtime=0)


def gen_unpack(rng: random.Random) -> Instance:
    members = {f"data/{w}.txt": f"{w} {rng.randint(0, 999)}\n".encode()
               for w in pick(rng, WORDS, rng.randint(2, 5))}

    def checks(s, run):
        out = [check(f"{p} is extracted", s.files().get(p) == d) for p, d in members.items()]
        out.append(check("count.txt is the number of files", text_eq(s, "count.txt",
                                                                     str(len(members)))))
        return out

    return Instance(
        instruction="Extract bundle.tar.gz into the current directory and write the number "
                    "of files it holds to count.txt.",
        files={"bundle.tar.gz": _tar_gz(members)},
        solution=[["tar xzf bundle.tar.gz", "tar tzf bundle.tar.gz | wc -l > count.txt"]],
        partial=["tar tzf bundle.tar.gz | wc -l > count.txt"],
        checks=checks,
        outputs=("count.txt", "data/"),
    )


# ----------------------------------------------------------------------------- 15 score_stats


def gen_score_stats(rng: random.Random) -> Instance:
    names = pick(rng, WORDS, rng.randint(4, 8))
    scores = [rng.randint(1, 99) for _ in names]
    return Instance(
        instruction="Each line of scores.txt is: NAME SCORE. Write the total of the scores "
                    "to total.txt and the highest score to max.txt.",
        files={"scores.txt": join_lines(f"{n} {v}" for n, v in zip(names, scores,
                                                                  strict=True))},
        solution=[["awk '{s+=$2} END{print s}' scores.txt > total.txt",
                   "awk '$2>m{m=$2} END{print m}' scores.txt > max.txt"]],
        partial=["awk '$2>m{m=$2} END{print m}' scores.txt > max.txt"],
        checks=lambda s, run: [
            check("total.txt is the total score", text_eq(s, "total.txt", str(sum(scores)))),
            check("max.txt is the highest score", text_eq(s, "max.txt", str(max(scores)))),
        ],
        outputs=("total.txt", "max.txt"),
    )


# ----------------------------------------------------------------------------- 16 grep_files


def gen_grep_files(rng: random.Random) -> Instance:
    dirs = ["notes"] + [f"notes/{w}" for w in pick(rng, WORDS, 2)]
    files: dict[str, bytes] = {}
    for w in pick(rng, WORDS, rng.randint(6, 9)):
        files[f"{rng.choice(dirs)}/{w}.txt"] = f"{w} can wait\n".encode()
    hits = sorted(rng.sample(sorted(files), rng.randint(2, 4)))
    for p in hits:
        files[p] = f"URGENT: call {rng.choice(WORDS)}\n".encode()

    def checks(s, run):
        got = lines(s, "urgent.txt") or []
        out = [check(f"lists {p}", p in got) for p in hits]
        out.append(check("lists only files that contain URGENT",
                         got != [] and set(got) <= set(hits)))
        return out

    return Instance(
        instruction="Write the paths of the files under notes/ that contain the word URGENT, "
                    "sorted, one per line, to urgent.txt.",
        files=files,
        solution=[["grep -rl URGENT notes | sort > urgent.txt"]],
        partial=["grep -rl URGENT notes | sort | head -1 > urgent.txt"],
        checks=checks,
        outputs=("urgent.txt",),
    )


# ----------------------------------------------------------------------------- multi-turn
# 17 hint_lookup (2 turns): the file to use is named only inside the sandbox.


def gen_hint_lookup(rng: random.Random) -> Instance:
    names = [f"{w}.dat" for w in pick(rng, WORDS, 5)]
    target = rng.choice(names)
    secret = f"{rng.choice(WORDS)}-{rng.randint(100, 999)}"
    files = {f"vault/{n}": f"{rng.choice(WORDS)}-{rng.randint(100, 999)}\n".encode()
             for n in names}
    files[f"vault/{target}"] = f"{secret}\n".encode()
    files["hint.txt"] = f"The key is stored in vault/{target}\n".encode()
    return Instance(
        instruction="hint.txt says which file in vault/ holds the key. Write that file's name "
                    "(without vault/) to name.txt and its contents to key.txt.",
        files=files,
        solution=[["cat hint.txt"], [f"echo {target} > name.txt", f"cp vault/{target} key.txt"]],
        partial=[f"echo {target} > name.txt"],
        checks=lambda s, run: [
            check("name.txt names the key file", text_eq(s, "name.txt", target)),
            check("key.txt has the key", text_eq(s, "key.txt", secret)),
        ],
        outputs=("name.txt", "key.txt"),
        hidden=(target,),
    )


# 18 dir_hunt (2 turns): which file holds the marker is found by searching.


def gen_dir_hunt(rng: random.Random) -> Instance:
    dirs = [f"maze/{a}/{b}" for a, b in zip(pick(rng, WORDS, 4), pick(rng, WORDS, 4),
                                             strict=True)]
    files = {}
    for d in dirs:
        for w in pick(rng, WORDS, 2):
            files[f"{d}/{w}.txt"] = f"{w} nothing here\n".encode()
    target = rng.choice(sorted(files))
    files[target] = b"here lies the TREASURE\n"
    base = target.rsplit("/", 1)[1]

    def checks(s, run):
        return [
            check("found/ holds the marked file", s.files().get(f"found/{base}")
                  == b"here lies the TREASURE\n"),
            check("the marked file left maze/", target not in s),
            check("path.txt has the original path", text_eq(s, "path.txt", target)),
        ]

    return Instance(
        instruction="One file under maze/ contains the word TREASURE. Move it into a new "
                    "directory found/ (same name) and write its original path to path.txt.",
        files=files,
        solution=[["grep -rl TREASURE maze"],
                  ["mkdir -p found", f"mv {target} found/", f"echo {target} > path.txt"]],
        partial=[f"echo {target} > path.txt"],
        checks=checks,
        outputs=(f"found/{base}", "path.txt"),
        mutable=(target,),
        hidden=(target,),
    )


# 19 fix_script (2 turns): the failing function is named by check.sh's error message.

_OPS = {"add": ("+", "-"), "sub": ("-", "+"), "mul": ("*", "+"), "mod": ("%", "-")}
# Each function has its own argument names, so a fix (sed on "return x OP y") is unique.
_ARGS = {"add": ("a", "b"), "sub": ("c", "d"), "mul": ("x", "y"), "mod": ("m", "n")}


def _calc(f: str, a: int, b: int, broken: bool = False) -> int:
    op = _OPS[f][1 if broken else 0]
    return {"+": a + b, "-": a - b, "*": a * b, "%": a % b}[op]


def _case(rng: random.Random, f: str, lo: int, hi: int) -> tuple[str, int, int]:
    """Inputs on which the broken operator gives a different answer."""
    while True:
        a, b = rng.randint(lo, hi), rng.randint(2, 4 if hi < 10 else 9)
        if _calc(f, a, b) != _calc(f, a, b, broken=True):
            return f, a, b


def gen_fix_script(rng: random.Random) -> Instance:
    funcs = pick(rng, sorted(_OPS), rng.randint(3, 4))
    broken_set = set(rng.sample(funcs, 2))
    broken = [f for f in funcs if f in broken_set]  # the order check.sh reports them in
    src = "".join(
        "def {0}({1}, {2}):\n    return {1} {3} {2}\n\n".format(
            f, *_ARGS[f], _OPS[f][1] if f in broken else _OPS[f][0])
        for f in funcs)
    vis = [_case(rng, f, 5, 9) for f in funcs]
    check_sh = "#!/bin/sh\npython3 -B - <<'EOF'\nimport sys\nsys.path.insert(0, '.')\nimport calc\n"
    for f, a, b in vis:
        want = _calc(f, a, b)
        check_sh += (f"got = calc.{f}({a}, {b})\nif got != {want}:\n"
                     f"    sys.exit('FAIL {f}({a}, {b}): expected {want}, got %r' % got)\n")
    check_sh += "print('all ok')\nEOF\n"
    hidden_cases = [_case(rng, f, 10, 50) for f in funcs]
    nonce = f"{rng.getrandbits(48):012x}"
    # Stale bytecode (same size, same mtime second) must not answer for calc.py.
    probe = ("rm -rf __pycache__; python3 -B -c \"import sys, json; "
             "sys.path.insert(0, '.'); import calc; "
             f"print('{nonce}' + json.dumps([getattr(calc, f, lambda a, b: None)(a, b) "
             f"for f, a, b in {hidden_cases!r}]))\"")

    def checks(s, run):
        # One command: the hidden cases, then the *original* check.sh (not the agent's copy).
        r = run(f"{probe}; out=$(sh -c {sh_quote(check_sh)} 2>&1); "
                f'echo "{nonce}RC=$?"; echo "$out"', timeout=30)
        got, rc = None, None
        for ln in r.stdout.splitlines():
            if ln.startswith(nonce + "RC="):
                rc = ln[len(nonce) + 3:].strip()
            elif ln.startswith(nonce):
                try:
                    got = json.loads(ln[len(nonce):])
                except ValueError:
                    got = None
        out = []
        for i, (f, a, b) in enumerate(hidden_cases):
            out.append(check(f"{f} is correct", got is not None and got[i] == _calc(f, a, b),
                             f"stdout {r.stdout[-200:]!r} stderr {r.stderr[-200:]!r}"))
        out.append(check("check.sh passes", rc == "0" and "all ok" in r.stdout))
        return out

    fix = ["sed -i 's|return {1} {2} {3}|return {1} {0} {3}|' calc.py".format(
        _OPS[f][0], _ARGS[f][0], _OPS[f][1], _ARGS[f][1]) for f in broken]
    return Instance(
        instruction="calc.py is broken. Run sh check.sh, read the error, and fix calc.py until "
                    "check.sh prints 'all ok'. Do not edit check.sh.",
        files={"calc.py": src.encode(), "check.sh": check_sh.encode()},
        solution=[["sh check.sh"], [fix[0], "sh check.sh"], [fix[1], "sh check.sh"]],
        partial=[fix[0]],
        checks=checks,
        mutable=("calc.py",),
        hidden=tuple("return {1} {0} {2}".format(_OPS[f][1], *_ARGS[f]) for f in broken),
    )


# 20 env_repair (3 turns): run.sh names one missing setting at a time.


def gen_env_repair(rng: random.Random) -> Instance:
    keys = pick(rng, ["COLOR", "SIZE", "MODE", "REGION", "TIER", "LANG_CODE"], 2)
    choices = {"COLOR": ["red", "green", "blue"], "SIZE": ["small", "large"],
               "MODE": ["fast", "safe"], "REGION": ["north", "south"],
               "TIER": ["gold", "free"], "LANG_CODE": ["en", "fr", "de"]}
    vals = {k: rng.choice(choices[k]) for k in keys}
    word = rng.choice(WORDS)
    run_sh = "#!/bin/sh\n. ./config.env\n"
    for k in keys:
        opts = ",".join(choices[k])
        run_sh += (f'case "${k}" in {"|".join(choices[k])}) ;; *) '
                   f'echo "error: set {k} in config.env to one of {opts}" >&2; exit 1;; esac\n')
    run_sh += f'echo "{word} ${keys[0]} ${keys[1]}"\n'

    def checks(s, run):
        cfg = s.text("config.env") or ""
        kv = dict(ln.split("=", 1) for ln in cfg.splitlines() if "=" in ln)
        return [
            check(f"{keys[0]} is set", kv.get(keys[0], "").strip() in choices[keys[0]]),
            check(f"{keys[1]} is set", kv.get(keys[1], "").strip() in choices[keys[1]]),
            check("out.txt has run.sh's output", (s.text("out.txt") or "").strip().split(" ")[:1]
                  == [word] and run(f"sh -c {sh_quote(run_sh)}", 20).stdout.strip()
                  == (s.text("out.txt") or "").strip()),
        ]

    return Instance(
        instruction="sh run.sh fails. Read its error messages and fix config.env (pick "
                    "any allowed value) until it runs, then save its output to out.txt.",
        files={"run.sh": run_sh.encode(), "config.env": b"# settings\n"},
        solution=[["sh run.sh"], [f"echo {keys[0]}={vals[keys[0]]} >> config.env", "sh run.sh"],
                  [f"echo {keys[1]}={vals[keys[1]]} >> config.env", "sh run.sh > out.txt"]],
        partial=[f"echo {keys[0]}={vals[keys[0]]} >> config.env"],
        checks=checks,
        outputs=("out.txt",),
        mutable=("config.env",),
        hidden=(keys[0], keys[1]),
    )


# ----------------------------------------------------------------------------- look, act, check
# Three-turn families whose every later turn copies a value (a word or a number) that only
# the previous turn's output showed: look, act on what was seen, then act on what acting
# showed. Values are short and observations stay under ~200 characters, for a tiny model.

# 21 value_relay (3 turns): probe.sh prints a setting; app.sh, once app.conf has it, prints
# a token.

_RELAY_KEYS = {"port": (1024, 9999), "workers": (2, 64), "timeout": (10, 600),
               "limit": (100, 999)}
_TOKENS = ("lark", "moss", "pine", "reef", "sage", "teal", "wren", "yarn", "fern", "kiwi",
           "opal", "plum")


def gen_value_relay(rng: random.Random) -> Instance:
    key = rng.choice(sorted(_RELAY_KEYS))
    value = rng.randint(*_RELAY_KEYS[key])
    old = rng.choice([o for o in range(1, 10) if o != value])
    base = rng.randint(1, value - 1)
    tokens = pick(rng, _TOKENS, 8)
    token = tokens[value % 8]
    other = ["# app settings", "host=local", f"mode={rng.choice(['fast', 'safe'])}"]
    conf = [*other[:2], f"{key}={old}", other[2]]
    probe = f'#!/bin/sh\necho "{key}=$(({base} + {value - base}))"\n'
    app = ("#!/bin/sh\nwant=$(sh probe.sh | cut -d= -f2)\n"
           f"got=$(sed -n 's/^{key}=//p' app.conf)\n"
           'if [ "$got" != "$want" ]; then\n'
           f'  echo "error: {key}=$got in app.conf is not what probe.sh prints" >&2; exit 1\n'
           f"fi\nset -- {' '.join(tokens)}\nshift $((got % 8))\n"
           f'echo "app up with {key}=$got, token $1"\n')

    def checks(s, run):
        got = lines(s, "app.conf") or []
        mine = [ln for ln in got if ln.startswith(f"{key}=")]
        rest = [ln for ln in got if not ln.startswith(f"{key}=")]
        return [
            check(f"app.conf sets {key} to probe.sh's value", mine == [f"{key}={value}"]),
            check("other lines of app.conf kept", rest == other),
            check("token.txt has app.sh's token", text_eq(s, "token.txt", token)),
        ]

    fix = f"sed -i 's/^{key}=.*/{key}={value}/' app.conf"
    return Instance(
        instruction="sh probe.sh prints the setting app.conf needs. Put it in app.conf "
                    "(replace the old value), then run sh app.sh and write the token it "
                    "prints to token.txt.",
        files={"probe.sh": probe.encode(), "app.sh": app.encode(),
               "app.conf": join_lines(conf)},
        solution=[["sh probe.sh"], [fix, "sh app.sh"], [f"echo {token} > token.txt"]],
        partial=[fix],
        checks=checks,
        outputs=("token.txt",),
        mutable=("app.conf",),
        hidden=(str(value), token),
        variant=key,
    )


# 22 service_query (3 turns): start.sh prints a session id; query.sh answers only with it.

_CITIES = ("oslo", "lima", "rome", "kyiv", "baku", "nice", "riga", "bern")


def gen_service_query(rng: random.Random) -> Instance:
    cities = pick(rng, _CITIES, 5)
    city = cities[0]
    temps = {c: rng.randint(0, 39) for c in cities}
    session = rng.randint(100, 999)
    base = rng.randint(1, session - 1)
    answer = (temps[city] + session) % 40
    start = ("#!/bin/sh\nmkdir -p state\n"
             f"echo $(({base} + {session - base})) > state/session\n"
             'echo "service started, session $(cat state/session)"\n')
    table = " ".join(f"{c}) t={t};;" for c, t in sorted(temps.items()))
    query = ("#!/bin/sh\n"
             "if [ ! -f state/session ]; then\n"
             '  echo "error: service not started (sh start.sh)" >&2; exit 1\nfi\n'
             'if [ "$1" != "$(cat state/session)" ]; then\n'
             '  echo "error: wrong session $1; usage: sh query.sh SESSION CITY" >&2; exit 1\n'
             "fi\n"
             f'case "$2" in {table} *) echo "error: no city $2" >&2; exit 1;; esac\n'
             'echo "$1 $2" >> state/log\n'
             'echo "temperature in $2: $(( (t + $1) % 40 ))"\n')

    def checks(s, run):
        return [
            check("the service was started", text_eq(s, "state/session", str(session))),
            check(f"the service was asked about {city}",
                  f"{session} {city}" in (lines(s, "state/log") or [])),
            check(f"temp.txt has the service's answer for {city}",
                  text_eq(s, "temp.txt", str(answer))),
        ]

    return Instance(
        instruction=f"sh start.sh starts a weather service and prints its session id. Ask "
                    f"it for {city} with sh query.sh SESSION {city} and write the number it "
                    "answers to temp.txt.",
        files={"start.sh": start.encode(), "query.sh": query.encode()},
        solution=[["sh start.sh"], [f"sh query.sh {session} {city}"],
                  [f"echo {answer} > temp.txt"]],
        partial=["sh start.sh"],
        checks=checks,
        outputs=("state/", "temp.txt"),
        hidden=(str(session), str(answer)),
    )


# 23 find_then_fix (3 turns): check.sh names one bad file of conf/ at a time.

_NUM_KEYS = ("size", "count", "limit", "workers")
_BAD = ("big", "many", "auto", "lots", "high", "none")


def gen_find_then_fix(rng: random.Random) -> Instance:
    key = rng.choice(_NUM_KEYS)
    names = sorted(pick(rng, WORDS, rng.randint(4, 5)))
    broken = sorted(rng.sample(names, 2))  # check.sh reports them in glob (sorted) order
    bad = dict(zip(broken, pick(rng, _BAD, 2), strict=True))
    modes = {n: rng.choice(["fast", "safe"]) for n in names}

    def body(n, v):
        return f"name={n}\n{key}={v}\nmode={modes[n]}\n"

    files = {f"conf/{n}.cfg": body(n, bad.get(n, rng.randint(1, 99))).encode() for n in names}
    check_sh = ("#!/bin/sh\nfor f in conf/*.cfg; do\n"
                f"  v=$(sed -n 's/^{key}=//p' \"$f\")\n"
                f'  case "$v" in ""|*[!0-9]*) echo "error: $f: {key}=$v is not a number" >&2;'
                " exit 1;; esac\ndone\necho \"all ok\"\n")
    files["check.sh"] = check_sh.encode()

    def fixed(s, n):
        got = lines(s, f"conf/{n}.cfg") or []
        vals = [ln.split("=", 1)[1] for ln in got if ln.startswith(f"{key}=")]
        rest = [ln for ln in got if not ln.startswith(f"{key}=")]
        return (len(vals) == 1 and vals[0].isascii() and vals[0].isdigit()
                and rest == [f"name={n}", f"mode={modes[n]}"])

    def checks(s, run):
        r = run(f"sh -c {sh_quote(check_sh)}", timeout=20)
        passes = r.exit_code == 0 and r.stdout.strip() == "all ok"
        return [
            *(check(f"conf/{n}.cfg has a number for {key}", fixed(s, n)) for n in broken),
            check("check.sh passes", passes,
                  f"exit {r.exit_code}: {(r.stdout + r.stderr).strip()[-200:]!r}"),
            check("ok.txt has check.sh's output", passes and text_eq(s, "ok.txt", "all ok")),
        ]

    fix = [f"sed -i 's/{key}={bad[n]}/{key}=10/' conf/{n}.cfg" for n in broken]
    return Instance(
        instruction="sh check.sh fails: some files in conf/ have a bad value. Fix each file "
                    "it names (the value must be a number) until it prints 'all ok', then "
                    "save its output to ok.txt.",
        files=files,
        solution=[["sh check.sh"], [fix[0], "sh check.sh"], [fix[1], "sh check.sh > ok.txt"]],
        partial=[fix[0]],
        checks=checks,
        outputs=("ok.txt",),
        mutable=tuple(f"conf/{n}.cfg" for n in broken),
        hidden=tuple(f"conf/{n}.cfg" for n in broken),
        variant=key,
    )


# 24 count_then_report (3 turns): the log with the most ERROR lines, then what its errors
# name.

_CAUSES = ("disk", "auth", "dns", "cpu", "quota", "mem", "cache")


def gen_count_then_report(rng: random.Random) -> Instance:
    names = pick(rng, WORDS, rng.randint(4, 5))
    worst = rng.choice(names)
    top = rng.randint(4, 6)
    cause, *others = pick(rng, _CAUSES, 4)
    files = {}
    for n in names:
        k = top if n == worst else rng.randint(0, top - 1)
        rows = [f"ERROR {cause if n == worst else rng.choice(others)} failed" for _ in range(k)]
        rows += [rng.choice([f"INFO job {rng.randint(1, 99)} done",
                             f"WARN slow {rng.randint(1, 9)}s"])
                 for _ in range(rng.randint(2, 5))]
        rng.shuffle(rows)
        files[f"logs/{n}.log"] = join_lines(rows)

    def checks(s, run):
        got = (s.text("worst.txt") or "").split()
        return [
            check("worst.txt names the log with the most ERROR lines",
                  got[:1] in ([f"{worst}.log"], [f"logs/{worst}.log"])),
            check("worst.txt has its ERROR count", len(got) == 2 and got[1] == str(top)),
            check("cause.txt has the word after its ERRORs", text_eq(s, "cause.txt", cause)),
        ]

    return Instance(
        instruction="Find the log in logs/ with the most ERROR lines. Write its file name "
                    "and its ERROR count, as NAME COUNT, to worst.txt, then the word after "
                    "ERROR on its lines to cause.txt.",
        files=files,
        solution=[["grep -c ERROR logs/*.log"],
                  [f"echo {worst}.log {top} > worst.txt", f"grep ERROR logs/{worst}.log"],
                  [f"echo {cause} > cause.txt"]],
        partial=[f"echo {worst}.log {top} > worst.txt"],
        checks=checks,
        outputs=("worst.txt", "cause.txt"),
        hidden=(f"{worst}.log", cause),
    )


FAMILIES: tuple[Family, ...] = (
    Family("create_file", "file creation", "easy", 1, (1, 1), gen_create_file),
    Family("edit_replace", "file editing (sed)", "easy", 1, (3, 3), gen_edit_replace),
    Family("count_lines", "text processing (grep, wc)", "easy", 1, (2, 2), gen_count_lines),
    Family("sort_uniq", "text processing (sort, uniq)", "medium", 1, (3, 3), gen_sort_uniq),
    Family("column_sum", "arithmetic over files (awk)", "medium", 1, (2, 2), gen_column_sum),
    Family("find_tree", "searching a directory tree", "medium", 1, (4, 9), gen_find_tree),
    Family("json_extract", "JSON manipulation", "medium", 1, (3, 3), gen_json_extract),
    Family("csv_filter", "CSV manipulation", "medium", 1, (4, 4), gen_csv_filter),
    Family("config_edit", "config edits", "easy", 1, (4, 6), gen_config_edit),
    Family("permissions", "permissions (chmod)", "easy", 1, (4, 7), gen_permissions),
    Family("archive", "archives (tar, gzip)", "medium", 1, (4, 7), gen_archive),
    Family("batch_rename", "file operations at scale", "medium", 1, (20, 26), gen_batch_rename),
    Family("log_pipeline", "multi-step pipeline", "hard", 1, (5, 8), gen_log_pipeline),
    Family("unpack", "archives (tar)", "easy", 1, (3, 6), gen_unpack),
    Family("score_stats", "arithmetic over files (awk)", "easy", 1, (2, 2), gen_score_stats),
    Family("grep_files", "searching file contents (grep)", "easy", 1, (3, 5), gen_grep_files),
    Family("hint_lookup", "read then act", "easy", 2, (2, 2), gen_hint_lookup),
    Family("dir_hunt", "search then act", "medium", 2, (3, 3), gen_dir_hunt),
    Family("fix_script", "repair a broken script", "hard", 3, (4, 5), gen_fix_script),
    Family("env_repair", "repair from error messages", "hard", 3, (3, 3), gen_env_repair),
    Family("value_relay", "copy a command's output into a config", "medium", 3, (3, 3),
           gen_value_relay),
    Family("service_query", "start a service, then query it", "easy", 3, (3, 3),
           gen_service_query),
    Family("find_then_fix", "fix the files an error names", "hard", 3, (4, 4),
           gen_find_then_fix),
    Family("count_then_report", "count, look closer, report", "medium", 3, (3, 3),
           gen_count_then_report),
)
