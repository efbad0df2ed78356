"""The E2B door (SPEC §16): E2B's control-plane REST routes and envd's data plane,
translated to the same engine calls MCP and REST make (no rule of its own).

The contract, as read for this door:
- the `e2b` Python SDK 2.63.0 from the package index (pinned in pyproject's `dev`
  extras): the routes and models under `e2b/api/client`, `e2b/envd` (Connect RPC in
  its JSON codec) and `e2b/sandbox*`;
- e2b-dev/E2B at b8029973aa7da5f741f7bb1a9f833b38a0885438: `spec/openapi.yml` and
  `spec/envd/process/process.proto`, `spec/envd/filesystem/filesystem.proto`.

Modules: `shapes` (ids, answers, commands: pure), `connect` (the Connect protocol's
framing), `sandboxes` (the control plane's engine calls), `listing` (its reads: detail,
lists, metrics), `deadlines` (ends kept from the store), `asleep` (a sandbox asleep
since its end: `paused`, and who may wake it), `volumes` and `volume_mounts`
(E2B's `Volume` API and `volumeMounts`, as Rift's volumes), `templates`,
`template_steps` and `template_routes` (E2B's `Template.build` through Rift's builder,
its steps as a recipe), `envd` (the data plane),
`routes` (the Starlette routes mounted at `/e2b`).
"""
