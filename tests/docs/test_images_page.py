"""A user finds how to choose a gang's image, and the user's pages carry no test-suite detail
(that is on docs/testing.md, for contributors)."""

from tests.support import REPO

DOCS = REPO / "docs"


def test_images_md_shows_every_way_to_choose_the_image_and_what_it_needs():
    page = (DOCS / "images.md").read_text()
    section = " ".join(page[page.index("## Choosing the image"):
                            page.index("## `@pypi` and `@conda`")].split())
    for way in ('@batch(image="', '@kubernetes(image="', "METAFLOW_BATCH_CONTAINER_IMAGE",
                "METAFLOW_KUBERNETES_CONTAINER_IMAGE", "@pypi", "@conda", "/dev/shm",
                "CUDA build", "--with batch", "--with kubernetes"):
        assert way in section, way


def test_the_backend_pages_point_at_the_choice_of_image():
    batch = (DOCS / "aws-batch.md").read_text()
    assert "images.md#choosing-the-image" in batch.split("## ", 1)[0].replace("\n", " ")
    assert "unchanged:" not in batch.split("## ", 1)[0]


def test_user_pages_leave_the_test_suite_to_the_contributors_page():
    for name in ("aws-batch.md", "kubernetes.md", "images.md"):
        assert "tests/" not in (DOCS / name).read_text(), name
    assert "tests/emulation/test_k8s_gang.py" in (DOCS / "testing.md").read_text()
