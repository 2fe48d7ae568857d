"""``python -m nmtkit.datasets``: a thin command over :mod:`nmtkit.datasets` (``--help`` lists its options); the
package's ``__main__`` launches it, as ``bin/`` launches the six tools."""

from __future__ import annotations

import dataclasses
import json

from nmtkit.datasets.catalogue import CATALOGUE, catalogue
from nmtkit.datasets.fetch import Fetcher, describe, link


def main(argv=None) -> None:
    import click

    from nmtkit.cli import CONTEXT, ToolCommand, run, setup_logging

    @click.command(cls=ToolCommand, context_settings=CONTEXT)  # one-line usage errors, as the tools give them
    @click.argument("names", nargs=-1, metavar="[NAME]...")
    @click.option("--list", "list_", is_flag=True, help="List the catalogue (name, pairs, address, checksums).")
    @click.option("--all", "all_", is_flag=True, help="Every dataset of the catalogue (tens of GB: the WMT'14 "
                  "training corpora).")
    @click.option("--prefix", is_flag=True, help="Print one corpus prefix per dataset (PREFIX or SRC,TGT, as "
                  "nmt-prepare takes them) instead of one path per file.")
    @click.option("--link", "link_dir", type=click.Path(file_okay=False), metavar="DIR",
                  help="Also make symbolic links DIR/LAYOUT_PATH to the files (fixed paths for scripts).")
    @click.option("--cache", "cache_dir", type=click.Path(file_okay=False), metavar="DIR",
                  help="Cache directory [$NMTKIT_CACHE or ~/.cache/nmtkit].")
    @click.option("--data", "data_dir", type=click.Path(file_okay=False), metavar="DIR",
                  help="A local mirror to use instead of downloading [$NMTKIT_DATA].")
    @click.option("--mirror-url", metavar="URL", help="An HTTP mirror laid out like the shared data "
                  "[$NMTKIT_MIRROR_URL].")
    @click.option("--verify", is_flag=True, help="Re-check cached files against the sha256 in the cache manifest "
                  "(and the content of those the catalogue has no checksum for).")
    @click.option("--retries", default=3, show_default=True, help="Resumed retries of an interrupted download.")
    @click.option("--json", "as_json", is_flag=True, help="With --list: the catalogue as JSON.")
    @click.option("--quiet", "-q", is_flag=True)
    def main(names, list_, all_, prefix, link_dir, cache_dir, data_dir, mirror_url, verify, retries, as_json,
             quiet):
        """Find or download public English-French data: print where each file is on this machine.

        \b
        Files come from a local mirror ($NMTKIT_DATA), the cache ($NMTKIT_CACHE), an HTTP mirror
        ($NMTKIT_MIRROR_URL) or the publisher (downloaded once, checked, resumable: Ctrl-C keeps the
        partial download for the next call).
          python -m nmtkit.datasets --list
          python -m nmtkit.datasets newstest2014                 # prints .../newstest2014.en and .fr
          python -m nmtkit.datasets --prefix --link data/raw newstest2012 newstest2013 europarl-v7
        """
        setup_logging(quiet)

        def body():
            if list_:
                if as_json:
                    click.echo(json.dumps([describe(d) for d in catalogue()], indent=1))
                    return
                for d in catalogue():
                    checks = sorted({"sha256" if f.sha256 else "none" for f in d.files.values()})
                    dl = sorted({f.download.url for f in d.files.values()})
                    click.echo(f"{d.name:20} {d.pairs or '':>9}  files: {'/'.join(checks):6}  download: "
                               f"{' '.join(dl)} ({d.files['en'].download.policy})")
                return
            chosen = list(CATALOGUE) if all_ else list(names)
            if not chosen:
                raise click.UsageError("name at least one dataset (see --list), or --all")
            fetcher = Fetcher(cache_dir, data_dir, mirror_url, verify=verify, retries=retries)
            for name in chosen:
                resolved = fetcher.get(name)
                if link_dir:  # print the links: fixed paths, wherever the files are
                    resolved = dataclasses.replace(resolved, files=link(resolved, link_dir))
                if prefix:
                    click.echo(resolved.prefix)
                else:
                    for path in resolved.files.values():
                        click.echo(str(path))

        run("nmtkit.datasets", body)

    main(args=argv, prog_name="python -m nmtkit.datasets")

