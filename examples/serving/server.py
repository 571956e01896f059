"""A small completion server written the way users write one: FastAPI + uvicorn + torch.

A tiny character-level model (an embedding, a GRU cell, a projection; a few thousand
parameters, random weights fixed by a seed) serves an OpenAI-style API:

- ``GET  /health``: 200 once the model is loaded;
- ``POST /v1/completions``: ``{"prompt": "...", "max_tokens": 16, "stream": true}``;
  with ``stream`` the answer is server-sent events, one ``data:`` chunk per generated
  character and ``data: [DONE]`` at the end, as OpenAI-compatible servers send them.

    python server.py --port 8765
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import uvicorn
from fastapi import FastAPI
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel

VOCAB = "abcdefghijklmnopqrstuvwxyz .,"


class TinyLM(torch.nn.Module):
    def __init__(self, vocab: int, hidden: int = 32) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, hidden)
        self.cell = torch.nn.GRUCell(hidden, hidden)
        self.head = torch.nn.Linear(hidden, vocab)

    @torch.no_grad()
    def generate(self, prompt: list[int], n: int):
        h = torch.zeros(1, self.cell.hidden_size)
        for t in prompt:
            h = self.cell(self.embed(torch.tensor([t])), h)
        token = prompt[-1] if prompt else 0
        for _ in range(n):
            h = self.cell(self.embed(torch.tensor([token])), h)
            token = int(self.head(h).argmax())
            yield token


class Completion(BaseModel):
    prompt: str = ""
    max_tokens: int = 16
    stream: bool = False


def build_app(model: TinyLM) -> FastAPI:
    app = FastAPI()

    @app.get("/health")
    def health() -> dict[str, str]:
        return {"status": "ok"}

    def encode(text: str) -> list[int]:
        return [VOCAB.index(c) for c in text.lower() if c in VOCAB] or [0]

    @app.post("/v1/completions")
    def completions(req: Completion):
        tokens = model.generate(encode(req.prompt), max(1, min(req.max_tokens, 256)))
        if not req.stream:
            text = "".join(VOCAB[t] for t in tokens)
            return JSONResponse({"object": "text_completion", "choices": [{"text": text}]})

        def events():
            for t in tokens:
                chunk = {"object": "text_completion", "choices": [{"text": VOCAB[t]}]}
                yield f"data: {json.dumps(chunk)}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    return app


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8765)
    args = parser.parse_args()
    t0 = time.perf_counter()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = TinyLM(len(VOCAB)).eval()
    params = sum(p.numel() for p in model.parameters())
    print(f"model: {params:,} parameters, loaded in {time.perf_counter() - t0:.2f} s", flush=True)
    uvicorn.run(build_app(model), host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
