"""`rvqlm reconstruct / encode / decode` on a real speech file, with a tiny codec saved in a tmp dir."""

from __future__ import annotations

import pytest
import soundfile as sf
import torch

from codec import Codec, CodecConfig
from codec.core.audio import load_audio
from codec.core.rvq_file import read_rvq
from rvqlm.cli import main

SEANET = dict(kind="seanet", channels=4, dilations=(1, 3))
TINY = CodecConfig.from_dict(dict(latent_dim=16, encoder=SEANET, decoder=SEANET,
                                  quantizer=dict(n_codebooks=4, codebook_size=32, kmeans_iters=2)))


@pytest.fixture(scope="module")
def tiny_codec_dir(tmp_path_factory, speech_files):
    torch.manual_seed(0)
    codec = Codec(TINY).train()
    codec(load_audio(speech_files["train"][0], 16000)[None, :, :16000])  # k-means init on real speech
    return codec.eval().save_pretrained(tmp_path_factory.mktemp("codec") / "tiny")


@pytest.fixture(scope="module")
def speech(speech_files):
    return speech_files["test"][0]


def test_reconstruct(tmp_path, tiny_codec_dir, speech, capsys):
    out = tmp_path / "recon.wav"
    assert main(["reconstruct", str(speech), str(out), "--codec", str(tiny_codec_dir), "--n-codebooks", "2"]) == 0
    info, ref = sf.info(str(out)), sf.info(str(speech))
    assert (info.samplerate, info.channels, info.frames) == (16000, 1, ref.frames)
    assert "2 codebooks" in capsys.readouterr().out


def test_real_ogg_is_resampled(tmp_path, tiny_codec_dir, real_ogg):
    out = tmp_path / "recon.flac"
    assert main(["reconstruct", str(real_ogg), str(out), "--codec", str(tiny_codec_dir)]) == 0
    src = sf.info(str(real_ogg))
    assert sf.info(str(out)).samplerate == 16000
    assert abs(sf.info(str(out)).frames - src.frames * 16000 / src.samplerate) <= 2


def test_encode_decode_round_trip(tmp_path, tiny_codec_dir, speech):
    rvq, wav_out = tmp_path / "x.rvq", tmp_path / "x.wav"
    assert main(["encode", str(speech), str(rvq), "--codec", str(tiny_codec_dir)]) == 0
    codes, header = read_rvq(rvq)
    codec = Codec.from_pretrained(tiny_codec_dir)
    wav = load_audio(speech, 16000)
    assert torch.equal(codes, codec.encode(wav[None])[0])
    assert header["codec_fingerprint"] == codec.token_fingerprint() and header["n_samples"] == wav.shape[-1]
    assert header["source"] == speech.name and header["bits"] == 5
    assert main(["decode", str(rvq), str(wav_out), "--codec", str(tiny_codec_dir)]) == 0
    decoded = load_audio(wav_out, 16000)
    expected = codec.decode(codes[None])[0, :, : wav.shape[-1]].clamp(-1, 1)
    assert decoded.shape == wav.shape
    assert torch.allclose(decoded, expected, atol=2 / 32768)  # 16-bit PCM rounding only


def test_decode_refuses_another_codecs_file(tmp_path, tiny_codec_dir, speech, capsys):
    rvq = tmp_path / "x.rvq"
    assert main(["encode", str(speech), str(rvq), "--codec", str(tiny_codec_dir)]) == 0
    other = Codec(TINY).save_pretrained(tmp_path / "other")
    assert main(["decode", str(rvq), str(tmp_path / "y.wav"), "--codec", str(other)]) == 2
    err = capsys.readouterr().err
    mine = Codec.from_pretrained(tiny_codec_dir).token_fingerprint()
    theirs = Codec.from_pretrained(other).token_fingerprint()
    assert "was made by codec" in err and mine[:16] in err and theirs[:16] in err
    assert not (tmp_path / "y.wav").exists()


def test_decode_accepts_a_fine_tuned_decoder_and_old_headers(tmp_path, tiny_codec_dir, speech):
    """Same tokens, new decoder: decodes (with the new decoder). A header holding a full fingerprint
    instead of the token one is refused."""
    from codec.core.rvq_file import write_rvq

    rvq = tmp_path / "x.rvq"
    assert main(["encode", str(speech), str(rvq), "--codec", str(tiny_codec_dir)]) == 0
    tuned = Codec.from_pretrained(tiny_codec_dir)
    with torch.no_grad():
        for p in tuned.decoder.parameters():
            p.mul_(1.01)
    tuned_dir = tuned.save_pretrained(tmp_path / "tuned")
    assert main(["decode", str(rvq), str(tmp_path / "t.wav"), "--codec", str(tuned_dir)]) == 0
    codes, header = read_rvq(rvq)
    expected = tuned.decode(codes[None])[0, :, : header["n_samples"]].clamp(-1, 1)
    assert torch.allclose(load_audio(tmp_path / "t.wav", 16000), expected, atol=2 / 32768)

    old = Codec.from_pretrained(tiny_codec_dir)
    write_rvq(tmp_path / "old.rvq", codes, {**header, "codec_fingerprint": old.fingerprint()})
    assert main(["decode", str(tmp_path / "old.rvq"), str(tmp_path / "o.wav"), "--codec", str(tiny_codec_dir)]) == 2
    assert main(["decode", str(tmp_path / "old.rvq"), str(tmp_path / "p.wav"), "--codec", str(tuned_dir)]) == 2


@pytest.mark.parametrize("argv, message", [
    (["reconstruct", "{speech}", "{out}", "--codec", "{codec}", "--n-codebooks", "5"], "--n-codebooks must be in 1..4"),
    (["reconstruct", "{missing}", "{out}", "--codec", "{codec}"], "no such file"),
    (["encode", "{speech}", "{out}", "--codec", "{missing}"], "no codec folder"),
    (["decode", "{speech}", "{out}", "--codec", "{codec}"], "not an .rvq file"),
])
def test_clear_errors(tmp_path, tiny_codec_dir, speech, capsys, argv, message):
    values = {"speech": speech, "out": tmp_path / "o.wav", "codec": tiny_codec_dir, "missing": tmp_path / "nope"}
    assert main([a.format(**values) for a in argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]


def test_export_codec_from_a_lightning_checkpoint(tmp_path, speech_files):
    """`rvqlm export-codec CKPT OUT` turns a training checkpoint into a from_pretrained folder."""
    import lightning as L

    from codec import Codec
    from codec.neural.data import CodecDataModule
    from codec.neural.training import CodecModule
    from rvqlm.cli import main

    seanet = {"kind": "seanet", "channels": 4, "dilations": [1]}
    module = CodecModule(codec={"latent_dim": 8, "encoder": seanet, "decoder": seanet,
                                "quantizer": {"n_codebooks": 2, "codebook_size": 16}}, losses={"mel_n_ffts": [256]})
    data = CodecDataModule(corpus_dir=str(speech_files["train"][0].parents[2]), crop_seconds=0.2, batch_size=2,
                           max_train_files=4, max_valid_files=1)
    trainer = L.Trainer(accelerator="cpu", max_steps=2, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0,
                        default_root_dir=tmp_path)
    trainer.fit(module, datamodule=data)
    trainer.save_checkpoint(tmp_path / "run.ckpt")
    ckpt = torch.load(tmp_path / "run.ckpt", weights_only=True)
    ckpt["hyper_parameters"]["_instantiator"] = "lightning.pytorch.cli.instantiate_module"  # as LightningCLI saves
    torch.save(ckpt, tmp_path / "run.ckpt")
    assert main(["export-codec", str(tmp_path / "run.ckpt"), str(tmp_path / "out")]) == 0
    codec = Codec.from_pretrained(tmp_path / "out")
    assert codec.fingerprint() == module.codec.fingerprint()
    # A saved codec folder is written again, its decoder in half precision: same tokens.
    assert main(["export-codec", str(tmp_path / "out"), str(tmp_path / "half"), "--dtype", "float16"]) == 0
    half = Codec.from_pretrained(tmp_path / "half")
    assert half.token_fingerprint() == codec.token_fingerprint() and half.fingerprint() != codec.fingerprint()
    (tmp_path / "junk.ckpt").write_bytes(b"not a checkpoint")
    assert main(["export-codec", str(tmp_path / "junk.ckpt"), str(tmp_path / "out2")]) == 2
    assert not (tmp_path / "out2").exists()
