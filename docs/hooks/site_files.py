"""MkDocs hook: the pages the site takes from elsewhere than docs/.

The API reference is written here, not by hand: one page per public module, with a
``::: module.Name`` block for every name of ``merlin_torch_serving.__all__``. The package imports
its public names lazily through its ``_LAZY`` table (name -> module), which the static reader of
mkdocstrings cannot follow, so the table itself says where each name is documented, and a name
that moves to another module moves in the reference with it. The benchmark results (with their
chart) and the examples' READMEs are taken from where they live in the repository, under the same
paths, so the pages link to them and the chart is the file the benchmark draws.
"""

from __future__ import annotations

import ast
import importlib.util
from collections import defaultdict
from pathlib import Path

from mkdocs.structure.files import File, Files
from mkdocs.structure.nav import Navigation, Section
from mkdocs.structure.pages import Page

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = "reference"
# Repository files the pages link to, as glob patterns from the root.
REPOSITORY_FILES = (
    "benchmarks/README.md",
    "benchmarks/results/*.md",
    "benchmarks/results/*.png",
    "examples/*/README.md",
)


def public_names() -> dict[str, list[str]]:
    """Public module -> the names of ``__all__`` it documents, in ``__all__``'s order."""
    import merlin_torch_serving as package

    modules: dict[str, list[str]] = defaultdict(list)
    for name in package.__all__:
        # Names outside _LAZY are imported eagerly by the package: their __module__ is known
        # without importing anything more.
        module = package._LAZY.get(name) or getattr(package, name).__module__
        modules[module].append(name)
    return dict(sorted(modules.items()))


def module_summary(module: str) -> str:
    """The first line of a module's docstring, read from its source without importing it."""
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise RuntimeError(f"the public module {module} cannot be found")
    docstring = ast.get_docstring(ast.parse(Path(spec.origin).read_text())) or ""
    return " ".join(docstring.split("\n\n", 1)[0].split())


def reference_pages() -> dict[str, str]:
    """Path under docs/ -> Markdown of the reference's pages."""
    modules = public_names()
    index = [
        "# API reference",
        "",
        "Every public name of `merlin_torch_serving`; import each from the package itself",
        "(`from merlin_torch_serving import PredictPytorch`). The pages are grouped by the module",
        "that defines the name, and generated from the docstrings.",
        "",
    ]
    pages = {}
    for module, names in modules.items():
        summary = module_summary(module)
        index += [f"## [`{module}`]({module}.md)", "", summary, ""]
        index += [f"- [`{name}`][{module}.{name}]" for name in names] + [""]
        blocks = [f"::: {module}.{name}\n" for name in names]
        pages[f"{REFERENCE}/{module}.md"] = f"# `{module}`\n\n{summary}\n\n" + "\n".join(blocks)
    pages[f"{REFERENCE}/index.md"] = "\n".join(index)
    return pages


def on_files(files: Files, config) -> Files:
    for path, content in reference_pages().items():
        files.append(File.generated(config, path, content=content))
    for pattern in REPOSITORY_FILES:
        for source in sorted(ROOT.glob(pattern)):
            uri = source.relative_to(ROOT).as_posix()
            files.append(File.generated(config, uri, abs_src_path=str(source)))
    return files


def on_nav(nav: Navigation, config, files: Files) -> Navigation:
    """The module pages under "API reference", after its index."""
    [section] = [
        item for item in nav.items if isinstance(item, Section) and item.title == "API reference"
    ]
    for file in sorted(files.documentation_pages(), key=lambda f: f.src_uri):
        if file.src_uri.startswith(f"{REFERENCE}/") and file.src_uri != f"{REFERENCE}/index.md":
            page = Page(None, file, config)
            page.parent = section
            section.children.append(page)
    return nav
