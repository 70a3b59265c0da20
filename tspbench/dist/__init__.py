"""Everything that talks between ranks: the counted collectives (comm.py), named process
groups over mesh axes (mesh.py), the zigzag sequence partition (zigzag.py) and the local
launcher that starts a world of ranks (launch.py)."""
