#!/usr/bin/env python3
"""The lab's model server: stands in for the Hugging Face hub (and the office uplink in front of it).

    serve.py DIR --bind ADDRESS --port PORT

serves DIR (lab/model/make-models.py's models, their manifests, the real engine's wheelhouse) as
`python3 -m http.server` did: http://ADDRESS:PORT/<path>. One addition, so that a lab fetch can take
the time a real one does: the same files under /uplink/<KiB per second>/<path> arrive no faster than
that rate (per request; a fetch reads one file at a time). A lab inventory picks the shape of its
uplink in data, in its weights_source, e.g. `http://198.18.0.1:8089/uplink/320` (lab/inventory_vllm_cpu.py).
Never imported by the deploy: what the deploy's fetcher (roles/fanout/sfl_files.py fetch_http) sees is
a plain HTTP server, which ignores Range requests (200, whole file: the fetcher starts the file again).
"""
import argparse
import functools
import http.server
import re
import sys
import time

UPLINK = re.compile(r"^/uplink/(?P<kib>[1-9][0-9]{0,6})(?P<rest>/.*)$")
CHUNK = 16 * 1024  # bytes per write: at the lowest rates still several writes a second


class Handler(http.server.SimpleHTTPRequestHandler):
    rate = 0  # bytes per second for this request; 0: as fast as the link

    def send_head(self):
        match = UPLINK.match(self.path)
        if match:
            self.path, self.rate = match["rest"], int(match["kib"]) * 1024
        return super().send_head()

    def copyfile(self, source, outputfile):
        if not self.rate:
            return super().copyfile(source, outputfile)
        start, sent = time.monotonic(), 0
        while chunk := source.read(CHUNK):
            sent += len(chunk)
            early = sent / self.rate - (time.monotonic() - start)
            if early > 0:  # a chunk leaves once the rate allows all of it: the last byte at size / rate
                time.sleep(early)
            outputfile.write(chunk)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory")
    parser.add_argument("--bind", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8089)
    args = parser.parse_args(argv)
    handler = functools.partial(Handler, directory=args.directory)
    with http.server.ThreadingHTTPServer((args.bind, args.port), handler) as server:
        print(f"serving {args.directory} on http://{args.bind}:{args.port}/ (and /uplink/<KiB/s>/...)", flush=True)
        server.serve_forever()


if __name__ == "__main__":
    sys.exit(main())
