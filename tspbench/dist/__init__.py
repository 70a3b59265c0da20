"""Everything that talks between ranks: the counted collectives (comm.py, with their record in
comm_log.py and the one path that issues each in comm_issue.py), the dispatch-level count of the
collectives torch's own wrappers issue (c10d_count.py), named process groups over mesh axes
(mesh.py), the zigzag sequence partition (zigzag.py), the local launcher that starts a world of
ranks (launch.py) and the fake process group of any size (fake_world.py)."""
