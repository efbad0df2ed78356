"""Private hosts for libvirt's test driver, sized as a test needs.

`test:///default` is one shared host per process (and forgets everything when
its last connection closes); `test:///abs/path/node.xml` gives each open its
own fresh host, sized by the node XML written here, so two opens of one file do
not share domains, and a closed and reopened connection finds the host empty.
The test driver checks no capacity: these sizes only feed `info()`.
"""

from __future__ import annotations

import os
import urllib.parse
import xml.etree.ElementTree as ET


def write_test_host_xml(path: str, vcpus: int, memory_mib: int) -> str:
    """Write a test-driver node of this size to `path`; return its `test:///` URI."""
    if vcpus < 1 or memory_mib < 1:
        raise ValueError("a test host needs at least one vCPU and one MiB")
    node = ET.Element("node")
    cpu = ET.SubElement(node, "cpu")
    for tag, value in (
        ("mhz", 2000),
        ("model", "x86_64"),
        ("nodes", 1),
        ("sockets", 1),
        ("cores", vcpus),
        ("threads", 1),
        ("active", vcpus),
    ):
        ET.SubElement(cpu, tag).text = str(value)
    ET.SubElement(node, "memory").text = str(memory_mib * 1024)  # KiB
    absolute = os.path.abspath(path)
    with open(absolute, "w", encoding="utf-8") as handle:
        handle.write(ET.tostring(node, encoding="unicode") + "\n")
    return "test://" + urllib.parse.quote(absolute)
