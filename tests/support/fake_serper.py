"""A loopback stand-in for serper.dev's /search plus the web pages its results link to."""

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response


class FakeSerper:
    def __init__(self, api_key: str, results: list[dict], pages: dict[str, tuple[bytes, str]] | None = None):
        """`results`: organic items (title, link, snippet); `pages`: path -> (body bytes, Content-Type)."""
        self.api_key = api_key
        self.results = results
        self.pages = pages or {}
        self.requests: list[dict] = []
        self.seen_keys: list[str | None] = []
        self.pages_served: list[str] = []
        self.failures_left = 0  # the next requests answer HTTP 429 (with `retry_after` as Retry-After when set)
        self.retry_after: str | None = None
        self.raw_answer: tuple[bytes, int] | None = None  # a fixed answer (body bytes, status) on demand
        self.app = self._build_app()

    def _build_app(self) -> FastAPI:
        app = FastAPI()

        @app.post("/search")
        async def search(request: Request):
            self.seen_keys.append(request.headers.get("X-API-KEY"))
            if request.headers.get("X-API-KEY") != self.api_key:
                return JSONResponse({"message": "Unauthorized."}, status_code=403)
            if self.failures_left > 0:
                self.failures_left -= 1
                headers = {"Retry-After": self.retry_after} if self.retry_after else None
                return JSONResponse({"message": "busy"}, status_code=429, headers=headers)
            body = await request.json()
            self.requests.append(body)
            if self.raw_answer is not None:
                return Response(self.raw_answer[0], status_code=self.raw_answer[1], media_type="application/json")
            return {"searchParameters": body, "organic": self.results[: body.get("num", 10)]}

        @app.get("/pages/{name}")
        async def page(name: str):
            if name not in self.pages:
                return Response(status_code=404)
            self.pages_served.append(name)
            body, content_type = self.pages[name]
            return Response(content=body, media_type=None, headers={"Content-Type": content_type})

        return app
