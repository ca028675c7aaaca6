import runpy, sys
sys.path.insert(0, "gguf-py"); sys.path.insert(0, ".")
import conversion.base as b
for name in dir(b):
    cls = getattr(b, name)
    if isinstance(cls, type) and "get_vocab_base_pre" in cls.__dict__:
        cls.get_vocab_base_pre = lambda self, tokenizer: "smollm"
sys.argv = ["convert_hf_to_gguf.py", *sys.argv[1:]]
runpy.run_path("convert_hf_to_gguf.py", run_name="__main__")
