"""The live web console served at `/`: boards, a live board page, player search, the score
distribution and an operations page, as server-rendered HTML plus one small script and one
stylesheet shipped in this package (no CDN; works offline)."""

from app.console.routes import router

__all__ = ["router"]
