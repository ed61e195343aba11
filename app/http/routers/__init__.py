"""The routes, one router per audience: game servers (ingest, scores), readers (reads), operators
(admin, ops). Each gets the app's `Service` by dependency (`app.http.service.ServiceDep`);
`app.http.create_app` includes them."""

from app.http.routers import admin, ingest, ops, profiles, quarantine, reads, scores

__all__ = ["ROUTERS"]

ROUTERS = (ingest.router, scores.router, reads.router, profiles.router, admin.router,
           quarantine.router, ops.router)
