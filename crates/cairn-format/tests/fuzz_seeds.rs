//! Seeds for the fuzz targets (`fuzz/seeds/<target>/`), taken from the golden vectors in
//! `crates/cairn-cli/tests/golden/`: decrypted with the golden password (the repository) or the
//! golden master secret `0x42 × 32` (the loose sealed files and pack). The seeds are committed;
//! to make them again:
//!
//! ```text
//! cargo test -p cairn-format --test fuzz_seeds -- --ignored
//! ```
//!
//! The test that runs by default only checks that every target has seeds.

use std::fs;
use std::path::{Path, PathBuf};

use cairn_format::compress::Codec;
use cairn_format::crypto::MasterKey;
use cairn_format::index;
use cairn_format::keyfile::KeyFile;
use cairn_format::pack::{read_header, BlobKind, ENTRY_LEN, TRAILER_LEN};
use cairn_format::sealed::{self, SealedKind};
use cairn_format::sorted;

const TARGETS: [&str; 15] = [
    "keyfile",
    "lock",
    "sealed",
    "blob_entry",
    "pack_header",
    "index",
    "tree",
    "snapshot",
    "deletion",
    "hint",
    "config",
    "decompress",
    "blob_decode",
    "ids",
    "sorted_index",
];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn golden() -> PathBuf {
    root().join("crates/cairn-cli/tests/golden")
}

fn only_file(dir: &Path) -> (String, Vec<u8>) {
    let mut files: Vec<_> = walk(dir);
    assert_eq!(files.len(), 1, "{dir:?}");
    let p = files.pop().unwrap();
    (p.file_name().unwrap().to_str().unwrap().to_string(), fs::read(&p).unwrap())
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out.sort();
    out
}

struct Seeds(PathBuf);

impl Seeds {
    fn put(&self, target: &str, name: &str, bytes: &[u8]) {
        let dir = self.0.join(target);
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join(name), bytes).unwrap();
    }
}

fn cat(parts: &[&[u8]]) -> Vec<u8> {
    parts.concat()
}

#[test]
fn every_fuzz_target_has_seeds() {
    for t in TARGETS {
        let dir = root().join("fuzz/seeds").join(t);
        let n = fs::read_dir(&dir).map(|d| d.count()).unwrap_or(0);
        assert!(n > 0, "no seeds in {dir:?}: run `cargo test -p cairn-format --test fuzz_seeds -- --ignored`");
    }
}

#[test]
#[ignore = "writes fuzz/seeds/ from the golden vectors"]
fn generate_fuzz_seeds() {
    let out = Seeds(root().join("fuzz/seeds"));
    let g = golden();
    let k42 = MasterKey::from_secret([0x42; 32]);
    let salt_of = |f: &[u8]| -> [u8; 32] { f[8..40].try_into().unwrap() };

    // The repository: key file, config, index, snapshot, pack.
    let repo = g.join("repo-v1");
    let (_, keyfile) = only_file(&repo.join("keys"));
    out.put("keyfile", "golden-v1", &keyfile);
    let master = KeyFile::parse("k", &keyfile).unwrap().unwrap_key("k", b"golden-password").unwrap().unwrap();
    let config = sealed::open(&master, SealedKind::Config, "config", &fs::read(repo.join("config")).unwrap()).unwrap();
    out.put("config", "golden-v1", &config);
    let (_, index_file) = only_file(&repo.join("index"));
    let index_plain = sealed::open(&master, SealedKind::Index, "i", &index_file).unwrap();
    out.put("index", "golden-v1", &index_plain);
    let (snap_name, snap_file) = only_file(&repo.join("snapshots"));
    let snap = sealed::open(&master, SealedKind::Snapshot, "s", &snap_file).unwrap();
    out.put("snapshot", "golden-v1", &snap);
    // Deletion manifests have no golden repository yet (a prune leaves none behind when it ends).
    let manifest = |packs: Vec<[u8; 32]>, index: Vec<[u8; 32]>| {
        cairn_format::deletion::Deletion {
            version: cairn_format::deletion::VERSION,
            created: if packs.is_empty() { 0 } else { 1_700_000_000 },
            packs: packs.into_iter().map(cairn_format::id::PackId).collect(),
            index_files: index.into_iter().map(cairn_format::id::IndexId).collect(),
        }
        .to_bytes()
    };
    out.put("deletion", "two-packs-v1", &manifest(vec![[1; 32], [3; 32]], vec![[2; 32]]));
    out.put("deletion", "empty-v1", &manifest(vec![], vec![]));
    // The start hint: the golden vector (sealed under the golden repository's key: it splits,
    // its body does not open under 0x42), one sealed under 0x42 carrying the golden key file,
    // and bodies.
    let golden_hint = fs::read(g.join("hint-v1.bin")).unwrap();
    out.put("hint", "golden-v1", &cat(&[&[0], &golden_hint]));
    let golden_body =
        sealed::open(&master, SealedKind::Hint, "hint", cairn_format::hint::split(&golden_hint).unwrap().sealed)
            .unwrap();
    out.put("hint", "body-golden-v1", &cat(&[&[1], &golden_body]));
    out.put(
        "hint",
        "sealed-42",
        &cat(&[&[0], &cairn_format::hint::join(&keyfile, &sealed::seal(&k42, SealedKind::Hint, &golden_body))]),
    );
    let empty = cairn_format::hint::Hint { version: cairn_format::hint::VERSION, written: 0, tree_packs: Vec::new() };
    out.put("hint", "body-empty", &cat(&[&[1], &empty.to_bytes()]));
    let (pack_name, pack) = only_file(&repo.join("data"));
    let (salt, entries) = read_header(&master, "p", &pack).unwrap();
    let okey = master.object_key(&salt);
    let (mut trees, mut datas) = (0, 0);
    for e in &entries {
        let sealed = &pack[e.offset as usize..(e.offset + e.length) as usize];
        let stored = okey.open(&e.id.0, sealed).unwrap();
        let plain = cairn_format::pack::decode_blob(&master, &okey, e, sealed.to_vec(), "p").unwrap();
        if e.kind == BlobKind::Tree {
            out.put("tree", &format!("golden-v1-{trees}"), &plain);
            trees += 1;
        } else if stored.len() <= 4096 && datas < 6 {
            let (c, l) = e.codec.to_bytes();
            let seed = cat(&[&[c, l as u8], &e.raw_length.to_le_bytes(), &stored]);
            out.put("decompress", &format!("golden-v1-{datas}"), &seed);
            datas += 1;
        }
    }
    for (dir, name) in [("snapshots", &snap_name), ("index", &only_file(&repo.join("index")).0)] {
        out.put("ids", dir, format!("{dir}/{name}").as_bytes());
    }
    out.put("ids", "data", format!("data/{}/{pack_name}", &pack_name[..2]).as_bytes());
    out.put("ids", "upper", snap_name.to_ascii_uppercase().as_bytes());

    // The loose vectors, under 0x42 × 32.
    for (file, kind, sel) in
        [("sealed-config-v1.bin", SealedKind::Config, 0u8), ("sealed-snapshot-v1.bin", SealedKind::Snapshot, 2)]
    {
        let f = fs::read(g.join(file)).unwrap();
        out.put("sealed", &format!("raw-{file}"), &cat(&[&[0, sel], &f]));
        let plain = k42.object_key(&salt_of(&f)).open(&f[..8], &f[40..]).unwrap();
        out.put("sealed", &format!("envelope-{file}"), &cat(&[&[1, sel], &plain]));
        let body = sealed::open(&k42, kind, file, &f).unwrap();
        out.put("sealed", &format!("body-{file}"), &cat(&[&[2, sel], &body]));
        if kind == SealedKind::Snapshot {
            out.put("snapshot", "sealed-snapshot-v1", &body);
        } else {
            out.put("config", "sealed-config-v1", &body);
        }
    }
    out.put("sealed", "index-body", &cat(&[&[2, 1], &index_plain]));

    let gpack = fs::read(g.join("pack-v1.bin")).unwrap();
    out.put("pack_header", "raw-pack-v1", &cat(&[&[0], &gpack]));
    let (gsalt, gentries) = read_header(&k42, "p", &gpack).unwrap();
    let gkey = k42.object_key(&gsalt);
    let hlen = u32::from_le_bytes(gpack[gpack.len() - 8..gpack.len() - 4].try_into().unwrap()) as usize;
    let body_end = gpack.len() - TRAILER_LEN;
    let header_plain = gkey.open(b"cairn pack header v1", &gpack[body_end - hlen..body_end]).unwrap();
    let body = &gpack[..body_end - hlen];
    out.put("pack_header", "header-pack-v1", &cat(&[&[1], &(body.len() as u16).to_le_bytes(), body, &header_plain]));
    for (i, entry) in header_plain.chunks_exact(ENTRY_LEN).enumerate() {
        out.put("blob_entry", &format!("pack-v1-{i}"), entry);
        let e = &gentries[i];
        let sealed = &gpack[e.offset as usize..(e.offset + e.length) as usize];
        let stored = gkey.open(&e.id.0, sealed).unwrap();
        out.put("blob_decode", &format!("stored-pack-v1-{i}"), &cat(&[&[0], entry, &stored]));
        out.put("blob_decode", &format!("sealed-pack-v1-{i}"), &cat(&[&[1], entry, sealed]));
    }
    out.put("blob_decode", "plain-zstd", &cat(&[&[2, 2, 3], &b"cairn golden vector ".repeat(20)]));
    out.put("blob_decode", "plain-lz4", &cat(&[&[2, 1, 0], &b"cairn golden vector ".repeat(20)]));
    for (c, name) in [(Codec::Lz4, "lz4"), (Codec::Zstd(3), "zstd")] {
        let text = b"golden line 00000: the quick brown fox jumps over the lazy dog\n".repeat(8);
        let z = c.compress(&text).unwrap();
        let (cb, l) = c.to_bytes();
        out.put("decompress", &format!("text-{name}"), &cat(&[&[cb, l as u8], &(text.len() as u32).to_le_bytes(), &z]));
        out.put("decompress", &format!("roundtrip-{name}"), &cat(&[&[cb | 0x80, l as u8, 0, 0, 0, 0], &text]));
    }
    out.put("decompress", "none", &cat(&[&[0, 0, 5, 0, 0, 0], b"hello"]));

    // Index records re-encoded one pack at a time, and the lock object format (FORMAT.md §12).
    let packs = index::decode("i", &index_plain).unwrap();
    out.put("index", "one-pack", &index::encode(&packs[..1]));

    // The golden index as a sorted index file (mode 0), and its records for the target to
    // write into one (mode 1, no byte changed).
    let mut infos = Vec::new();
    let mut slots = Vec::new();
    for (n, p) in packs.iter().enumerate() {
        let mut info = sorted::PackInfo::new(p.id, p.salt, false);
        p.blobs.iter().for_each(|e| info.count(e));
        infos.push(info);
        slots.extend(p.blobs.iter().map(|&entry| sorted::Slot { entry, pack: n as u32 }));
    }
    sorted::sort_slots(&mut slots, |_| false);
    let mut writer = sorted::Writer::new(sorted::bits_for(slots.len() as u64));
    let mut file = vec![0u8];
    writer.records(&slots, &mut file).unwrap();
    file.extend_from_slice(&writer.finish(&infos, &[7; 32]));
    out.put("sorted_index", "golden-v1", &file);
    let mut records = vec![1u8, 0xff, 0xff];
    slots.iter().for_each(|s| s.encode(&mut records));
    out.put("sorted_index", "golden-v1-records", &records);
    out.put(
        "lock",
        "shared",
        br#"{"version":1,"exclusive":false,"hostname":"golden-host","username":"root","pid":4242,"created":1700000000,"refreshed":1700000300}"#,
    );
    out.put(
        "lock",
        "exclusive",
        br#"{"version":1,"exclusive":true,"hostname":"h","username":"u","pid":1,"created":0,"refreshed":18446744073709551615}"#,
    );
}
