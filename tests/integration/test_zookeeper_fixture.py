"""The harness itself: a real server, isolated chroots."""

from kazoo.client import KazooClient

from bklib.testing.zkserver import four_letter_word


def test_server_answers_ruok(zk_server):
    assert four_letter_word(zk_server.host, zk_server.port) == b"imok"


def test_chroots_are_isolated(zk, zk_server, zk_chroot):
    zk.create("/marker", b"x")
    chroot = zk_chroot.split("/", 1)[1]
    root = KazooClient(hosts=zk_server.connect_string)
    root.start()
    try:
        assert root.get(f"/{chroot}/marker")[0] == b"x"
        assert not root.exists("/marker")
    finally:
        root.stop()
