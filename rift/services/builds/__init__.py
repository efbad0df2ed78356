"""Images from a recipe (SPEC §19): the use cases (`builder`), one build's steps
and layers (`engine`), its context (`context`), the scripts its guest runs
(`scripts`), and its VM and layer files over the engine's own use cases (`guest`)."""
