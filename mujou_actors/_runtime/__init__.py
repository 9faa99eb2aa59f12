"""The private kernel of mujou_actors: what runs a net, below the public API.

Nothing here is public: its names and modules may change in any version.
``mujou_actors.run`` builds on it and drives it; nothing in it imports
``mujou_actors.run`` back.
"""
