"""A Model's chat template: the GGUF's (its tool_use one for a request with tools), an override, or for
the embedded default model its gemma-3 template (api.Model.chat_template; cli's describe and console)."""
from __future__ import annotations

from pathlib import Path

from ..errors import RamforgeError

# Google's gemma-3 chat template, used for the embedded default model, whose GGUF has none (as
# Ollama ships a template beside a model). Any other model without one gets llama.cpp's ChatML.
_DEFAULT_MODEL_TEMPLATE = Path(__file__).parents[1] / "templates" / "gemma3.jinja"   # ramforge/templates


def model_template(model, tools: bool = False):
    """Model.chat_template: the model's chat.ChatTemplate (loaded once, kept on the model). tools: a
    request with tools gets the GGUF's `tokenizer.chat_template.tool_use` where it has one (and no
    template was given), as llama.cpp."""
    if tools and model._chat_override is None:
        if model._chat_tool is None:
            from .chat import ChatTemplate
            from ..gguf.reader import GGUFFile

            with GGUFFile(model.path) as f:
                md = f.metadata
            model._chat_tool = (ChatTemplate.from_metadata(md, md["tokenizer.chat_template.tool_use"])
                                if isinstance(md.get("tokenizer.chat_template.tool_use"), str) else False)
        if model._chat_tool:
            return model._chat_tool
    if model._chat is None:
        from .chat import ChatTemplate
        from ..gguf.reader import GGUFFile

        with GGUFFile(model.path) as f:
            md = f.metadata
        model._chat = model_chat_template(md, model._is_default(), model._chat_override)
    return model._chat


def model_chat_template(md: dict, is_default: bool, override: str | None = None):
    """A model's chat.ChatTemplate from its GGUF metadata: override (a template's text) wins, then the GGUF's,
    then for the embedded default model its gemma-3 template (its GGUF ships none), else llama.cpp's ChatML."""
    from .chat import ChatTemplate

    if override is None and "tokenizer.chat_template" not in md and is_default:
        override = _DEFAULT_MODEL_TEMPLATE.read_text()
    return ChatTemplate.from_metadata(md, override)


def is_default_model(name, path) -> bool:
    """Whether name / path is the embedded default model."""
    from ..store.resolve import DEFAULT_NAMES, default_model_path

    try:
        return name in DEFAULT_NAMES or str(path) == str(default_model_path())
    except RamforgeError:
        return False
