"""A save image's domain XML as libvirt writes it, and the fork values it is rewritten
with (hypervisor.fork_xml): shared by the tests of save images and of forks."""

from __future__ import annotations

from hypervisor.fork_xml import ForkDomain, fork_domain_xml

# A save image's XML as libvirt 9.0 wrote it for a `tiny` guest (virDomainSave).
SAVED_XML = """<domain type='qemu' xmlns:qemu='http://libvirt.org/schemas/domain/qemu/1.0'>
  <name>rift-vm_k3v9x2m7</name>
  <uuid>9d02cac4-44c3-4295-8424-3df2a8960315</uuid>
  <metadata>
    <rift:vm xmlns:rift="https://rift.dev/xmlns/domain/1" task="task_old" vm="vm_k3v9x2m7" \
image="tiny" install="inst_1"/>
  </metadata>
  <memory unit='KiB'>262144</memory>
  <currentMemory unit='KiB'>262144</currentMemory>
  <vcpu placement='static'>1</vcpu>
  <os>
    <type arch='x86_64' machine='pc-q35-7.2'>hvm</type>
    <kernel>/var/lib/rift/images/tiny/vmlinux</kernel>
    <initrd>/var/lib/rift/images/tiny/initrd.img</initrd>
    <cmdline>console=ttyS0 quiet panic=-1 rift.key=c3NoLWVkMjU1MTk=</cmdline>
    <boot dev='hd'/>
  </os>
  <on_poweroff>destroy</on_poweroff>
  <devices>
    <emulator>/usr/bin/qemu-system-x86_64</emulator>
    <disk type='file' device='disk'>
      <driver name='qemu' type='qcow2' discard='unmap'/>
      <source file='/var/lib/rift/disks/vm_k3v9x2m7.qcow2'/>
      <target dev='vda' bus='virtio'/>
      <address type='pci' domain='0x0000' bus='0x01' slot='0x00' function='0x0'/>
    </disk>
    <controller type='usb' index='0' model='none'/>
    <serial type='file'>
      <source path='/var/lib/rift/serial/vm_k3v9x2m7.log'/>
      <target type='isa-serial' port='0'>
        <model name='isa-serial'/>
      </target>
    </serial>
    <console type='file'>
      <source path='/var/lib/rift/serial/vm_k3v9x2m7.log'/>
      <target type='serial' port='0'/>
    </console>
    <memballoon model='none'/>
  </devices>
  <qemu:commandline>
    <qemu:arg value='-netdev'/>
    <qemu:arg value='user,id=n0,hostfwd=tcp:127.0.0.1:40022-:22'/>
    <qemu:arg value='-device'/>
    <qemu:arg value='virtio-net-pci,netdev=n0,addr=0x10'/>
  </qemu:commandline>
</domain>
"""
NEW_UUID = "efc7cf55-2d67-4317-bd93-f86ec2f17025"
FORK = {
    "name": "rift-vm_fork0001",
    "uuid": NEW_UUID,
    "vm_id": "vm_fork0001",
    "task_id": "task_new",
    "disk": "/var/lib/rift/disks/vm_fork0001.qcow2",
    "serial_log": "/var/lib/rift/serial/vm_fork0001.log",
    "ssh_port": 41234,
}


def fork(xml: str = SAVED_XML, **changes: object) -> str:
    """`xml` rewritten with FORK's values, some of them changed."""
    return fork_domain_xml(xml, ForkDomain(**{**FORK, **changes}))  # type: ignore[arg-type]
