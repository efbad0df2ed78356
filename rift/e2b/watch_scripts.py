"""The guest half of a directory watch (rift.e2b.watches): the watcher a Rift
background exec runs, chosen in the guest. It prints `ready` once armed, one line
per event (`CREATE|WRITE|REMOVE|RENAME|CHMOD <tab> <name relative to the
directory>`), and for each line `<token>` on its stdin, `#<token>` once every
event before it is printed.

- `INOTIFY`, where the guest has `python3` (`debian`): inotify through ctypes,
  mapped as fsnotify maps it for envd (create and moved-to CREATE, modify WRITE,
  attrib CHMOD, delete and delete-self REMOVE, moved-from and move-self RENAME;
  one inotify event may print several lines); under a recursive watch each
  directory, and each one made later, is watched too; what a new directory
  already holds when its watch is armed is told as CREATE (and WRITE for a
  file that is not empty) once: inotify's own events for it, queued before the
  queue next runs dry, are dropped.
- `POLLING` elsewhere (busybox `tiny`: no python3, no inotifyd): `find` and
  `stat` every 0.5 s and at each token, compared with the last look by `awk`: a
  new entry CREATE (and WRITE for a regular file that is not empty); a regular
  file whose mtime or size changed WRITE, whose ctime alone changed CHMOD; a gone
  entry REMOVE. A rename is a REMOVE and a CREATE; a change undone between two
  looks is not seen; a directory gives only CREATE and REMOVE.
"""

from __future__ import annotations

import shlex

INOTIFY = """\
import os,sys,ctypes,struct,select
L=ctypes.CDLL(None,use_errno=True)
root=sys.argv[1];rec=sys.argv[2]=='1'
fd=L.inotify_init1(os.O_NONBLOCK)
W={}
def add(p):
 w=L.inotify_add_watch(fd,p.encode(),0xfc6)
 if w>=0:W[w]=p
S=set()
def tell(t,p):
 k=(t,p)
 if k in S:S.discard(k);return 0
 print(t+'\\t'+os.path.relpath(p,root));return 1
def tree(p,new=0):
 add(p)
 if rec:
  for d,ds,fs in os.walk(p):
   for x in ds:add(os.path.join(d,x))
   if new:
    for x in ds+fs:
     q=os.path.join(d,x);print('CREATE\\t'+os.path.relpath(q,root));S.add(('CREATE',q))
     try:z=x in fs and os.path.getsize(q)
     except OSError:z=0
     if z:print('WRITE\\t'+os.path.relpath(q,root));S.add(('WRITE',q))
tree(root)
print('ready',flush=True)
T=((0x180,'CREATE'),(0x840,'RENAME'),(0x4,'CHMOD'),(0x2,'WRITE'),(0x600,'REMOVE'))
def drain():
 while 1:
  try:b=os.read(fd,65536)
  except BlockingIOError:S.clear();return
  i=0
  while i+16<=len(b):
   w,m,c,n=struct.unpack_from('iIII',b,i);nm=b[i+16:i+16+n].rstrip(b'\\0');i+=16+n
   d=W.get(w)
   if d is None:continue
   p=os.path.join(d,nm.decode(errors='replace')) if nm else d
   told=[tell(t,p) for bit,t in T if m&bit]
   if rec and m&0x40000000 and m&0x180 and any(told):tree(p,1)
   if m&0x8000:W.pop(w,None)
  sys.stdout.flush()
while 1:
 r=select.select([fd,0],[],[])[0]
 if fd in r:drain()
 if 0 in r:
  l=os.read(0,4096)
  if not l:break
  drain()
  for t in l.split(b'\\n'):
   if t:print('#'+t[:32].decode(errors='replace'),flush=True)
"""

_SNAP = ("find \"$r\" -mindepth 1 $m -exec stat -c '%n\t%Y\t%s\t%Z\t%F' -- {} + 2>/dev/null"
         " | sort")
_DIFF = ("awk -F'\\t' -v n=$((${#r}+2)) 'FILENAME==ARGV[1]{o[$1]=$2\" \"$3;c[$1]=$4;next} "
         "{s[$1]=1;k=substr($1,n);f=($5==\"regular file\"); if(!($1 in o)){print \"CREATE\\t\"k;"
         " if(f&&$3>0)print \"WRITE\\t\"k} else if(!f){} else if(o[$1]!=$2\" \"$3)"
         "print \"WRITE\\t\"k; else if(c[$1]!=$4)print \"CHMOD\\t\"k} "
         "END{for(x in o)if(!(x in s))print \"REMOVE\\t\"substr(x,n)}' \"$t/a\" \"$t/b\"")
POLLING = (f"t=$(mktemp -d) || exit 1; {_SNAP} > \"$t/a\"; echo ready; "
           f"while :; do k=; if read -t 0.3 k; then :; else sleep 0.2; fi; "
           f"{_SNAP} > \"$t/b\"; {_DIFF}; mv \"$t/b\" \"$t/a\"; "
           f"[ -n \"$k\" ] && echo \"#$k\"; done")


def script(path: str, recursive: bool) -> str:
    """The watcher for `path` (which must be a directory: exit 20 if missing, 22 if
    not a directory, as rift.e2b.filesystem's scripts)."""
    quoted = shlex.quote(path)
    return (f"r={quoted}; [ -e \"$r\" ] || exit 20; [ -d \"$r\" ] || exit 22; "
            f"m={'' if recursive else shlex.quote('-maxdepth 1')}; "
            f"if command -v python3 >/dev/null 2>&1; then exec python3 -S -u -c "
            f"{shlex.quote(INOTIFY)} \"$r\" {int(recursive)}; else {POLLING}; fi")
