"""llama.cpp's own JSON-schema converter (common/json-schema-to-grammar.cpp), built from the llama.cpp
source vendored in llama-cpp-python's sdist, as an oracle for ramforge.structured.converter.

    python tools/schema_oracle.py '{"type": "integer", "minimum": 3}'     # prints llama.cpp's GBNF

llama-cpp-python's own LlamaGrammar.from_json_schema is an older Python copy of the converter (no
integer ranges, another whitespace rule); llama-server and llama.cpp's chat code use this C++ one.
The binary (g++, the converter, its JSON and trie helpers, and a small driver) is cached under
$RAMFORGE_ORACLE_BUILD (default ~/.cache/ramforge/oracle). LLAMA_CPP_SRC points at the source tree;
otherwise the sdist in the fixture cache ($RAMFORGE_FIXTURES, else fixtures/cache/) is unpacked there.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tools._fixtures import cache_dir  # noqa: E402

SDIST = cache_dir() / "llama_cpp_python-0.3.36.tar.gz"   # the fixture cache ($RAMFORGE_FIXTURES); tools/_fixtures fetches it
BUILD = Path(os.environ.get("RAMFORGE_ORACLE_BUILD", Path.home() / ".cache" / "ramforge" / "oracle"))

DRIVER = r"""
#include "json-schema-to-grammar.h"
#include <iostream>
#include <sstream>
int main() {
    std::stringstream ss; ss << std::cin.rdbuf();
    try { std::cout << json_schema_to_grammar(common_json::parse(ss.str()), true); }
    catch (const std::exception & e) { std::cerr << e.what() << std::endl; return 1; }
    return 0;
}
"""
# common.cpp's string helpers (same contracts), so that the converter links without the rest of common/
SHIM = r"""
#include <string>
#include <vector>
#include <cstdio>
#include <cstdlib>
std::string string_join(const std::vector<std::string> & v, const std::string & sep) {
    std::string r; for (size_t i = 0; i < v.size(); i++) { if (i) r += sep; r += v[i]; } return r; }
std::vector<std::string> string_split(const std::string & s, const std::string & d) {
    std::vector<std::string> out; size_t a = 0, b;
    while ((b = s.find(d, a)) != std::string::npos) { out.push_back(s.substr(a, b - a)); a = b + d.size(); }
    out.push_back(s.substr(a)); return out; }
std::string string_repeat(const std::string & s, size_t n) { std::string r; for (size_t i = 0; i < n; i++) r += s; return r; }
extern "C" void ggml_abort(const char * f, int l, const char *, ...) { fprintf(stderr, "abort %s:%d\n", f, l); abort(); }
"""


def source_dir() -> Path:
    if os.environ.get("LLAMA_CPP_SRC"):
        return Path(os.environ["LLAMA_CPP_SRC"])
    src = BUILD / "llama_cpp_python-0.3.36" / "vendor" / "llama.cpp"
    if not src.is_dir():
        BUILD.mkdir(parents=True, exist_ok=True)
        with tarfile.open(SDIST) as t:
            members = [m for m in t.getmembers() if "/vendor/llama.cpp/common/" in m.name
                       or "/vendor/llama.cpp/vendor/nlohmann/" in m.name or "/vendor/llama.cpp/include/" in m.name
                       or "/vendor/llama.cpp/ggml/include/" in m.name or "/vendor/llama.cpp/src/unicode" in m.name]
            t.extractall(BUILD, members=members, filter="data")
    return src


def binary() -> Path:
    exe = BUILD / "json_schema_to_grammar"
    if exe.exists():
        return exe
    src = source_dir()
    BUILD.mkdir(parents=True, exist_ok=True)
    (BUILD / "driver.cpp").write_text(DRIVER)
    (BUILD / "shim.cpp").write_text(SHIM)
    inc = [f"-I{src / d}" for d in ("common", "include", "ggml/include", "src", "vendor")]
    files = [src / "common" / f for f in ("json-schema-to-grammar.cpp", "json-schema.cpp", "json.cpp", "trie.cpp",
                                           "unicode.cpp")] + [BUILD / "driver.cpp", BUILD / "shim.cpp"]
    subprocess.run(["nice", "g++", "-O1", "-std=c++17", *inc, *map(str, files), "-o", str(exe)], check=True)
    return exe


def llama_cpp_schema_to_grammar(schema) -> str:
    """llama.cpp's GBNF for a schema; RuntimeError with its message when it refuses the schema."""
    r = subprocess.run([str(binary())], input=json.dumps(schema), capture_output=True, text=True)
    if r.returncode:
        raise RuntimeError(r.stderr.strip())
    return r.stdout


if __name__ == "__main__":
    print(llama_cpp_schema_to_grammar(json.loads(sys.argv[1])), end="")
