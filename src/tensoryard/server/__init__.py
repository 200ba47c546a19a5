"""The control plane: REST API, auth, scheduler loop and reconciler.

Import the submodules you need (`tensoryard.server.main` pulls in FastAPI and uvicorn).
"""
