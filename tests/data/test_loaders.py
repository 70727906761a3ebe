import json

import pytest

from kunlunlab.data import BENCHMARK_FILES, DataFormatError, corpus_from_examples, load_benchmark, load_corpus, load_qa


# ---------------------------------------------------------------- the real files in ../shared/data
def test_hotpot_distractor_sample(data_dir):
    examples = load_qa(data_dir / BENCHMARK_FILES["hotpotqa_distractor"])
    assert len(examples) == 60
    first = examples[0]
    assert first.question.startswith("Were Scott Derrickson and Ed Wood")
    assert first.answers == ["yes"] and first.type == "comparison"
    assert first.supporting_titles == ["Scott Derrickson", "Ed Wood"]
    assert len(first.context) == 10
    corpus = corpus_from_examples(examples)
    titles = {p.title for p in corpus}
    assert all(set(ex.supporting_titles) <= titles for ex in examples)  # a closed, answerable corpus


@pytest.mark.parametrize("name,count", [("hotpotqa", 7365), ("musique", 2117), ("bamboogle", 75)])
def test_searchr1_jsonl(data_dir, name, count):
    examples = load_benchmark(name, data_dir)
    assert len(examples) == count
    assert all(ex.question and ex.answers for ex in examples)
    assert len({ex.id for ex in examples}) == count


def test_2wiki_dev_with_string_or_alias_answers(data_dir):
    examples = load_benchmark("2wikimultihopqa", data_dir)
    assert len(examples) == 700
    assert examples[1].answers == ["Mask of Fu Manchu", "The Mask of Fu Manchu"]
    assert examples[2].answers == ["12 June 1516"]


def test_2wiki_corpus_title_text(data_dir):
    corpus = load_corpus(data_dir / "2wikimultihopqa/corpus.json")
    assert len(corpus) == 6119 and corpus[0].title == "Teutberga"
    assert corpus[0].contents.startswith('"Teutberga"\n')


def test_hotpot_contexts_as_corpus(data_dir):
    corpus = load_corpus(data_dir / BENCHMARK_FILES["hotpotqa_distractor"])
    assert len(corpus) == len({p.id for p in corpus}) > 500


def test_limit(data_dir):
    assert len(load_benchmark("hotpotqa", data_dir, limit=5)) == 5


# ---------------------------------------------------------------- layouts written here
def _jsonl(path, rows):
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def test_flashrag_qa_and_corpus(tmp_path):
    qa = _jsonl(tmp_path / "qa.jsonl", [{"id": "q1", "question": "Who?", "golden_answers": ["A", "B"]}])
    assert load_qa(qa)[0].answers == ["A", "B"]
    corpus = _jsonl(tmp_path / "c.jsonl", [{"id": "d1", "contents": '"Title"\nBody text.'}, {"id": 2, "contents": "No title"}])
    docs = load_corpus(corpus)
    assert (docs[0].title, docs[0].text) == ("Title", "Body text.")
    assert (docs[1].id, docs[1].title, docs[1].text) == ("2", "", "No title")


def test_searchr1_target_dict_and_prompt_fallback(tmp_path):
    row = {"data_source": "nq", "prompt": [{"role": "user", "content": "Q?"}], "reward_model": {"ground_truth": {"target": ["x", "y"]}}}
    ex = load_qa(_jsonl(tmp_path / "s.jsonl", [row]))[0]
    assert ex.question == "Q?" and ex.answers == ["x", "y"]


# ---------------------------------------------------------------- malformed input
def test_bad_json_line_names_file_and_line(tmp_path):
    path = tmp_path / "broken.jsonl"
    path.write_text('{"id": "1", "question": "a", "golden_answers": ["b"]}\n{"id": 2, "question": \n')
    with pytest.raises(DataFormatError, match=r"broken\.jsonl, line 2: invalid JSON"):
        load_qa(path)


def test_missing_field_names_the_field(tmp_path):
    path = _jsonl(tmp_path / "qa.jsonl", [{"id": "1", "question": "a", "golden_answers": ["b"]},
                                         {"id": "2", "golden_answers": ["c"]}])
    with pytest.raises(DataFormatError, match=r"line 2 \(field 'question'\): missing field"):
        load_qa(path)


def test_wrong_type_and_empty_answers(tmp_path):
    with pytest.raises(DataFormatError, match=r"field 'golden_answers'"):
        load_qa(_jsonl(tmp_path / "a.jsonl", [{"id": "1", "question": "a", "golden_answers": []}]))
    with pytest.raises(DataFormatError, match=r"record 0 \(field 'context'\)"):
        path = tmp_path / "h.json"
        path.write_text(json.dumps([{"question": "q", "answer": "a", "supporting_facts": [], "context": "oops"}]))
        load_qa(path)


def test_unrecognised_layout_and_missing_file(tmp_path):
    with pytest.raises(DataFormatError, match="unrecognised QA layout"):
        load_qa(_jsonl(tmp_path / "x.jsonl", [{"foo": 1}]))
    with pytest.raises(DataFormatError, match="unrecognised corpus layout"):
        load_corpus(_jsonl(tmp_path / "y.jsonl", [{"foo": 1}]))
    with pytest.raises(FileNotFoundError, match="data file not found"):
        load_qa(tmp_path / "nope.jsonl")


def test_non_object_record(tmp_path):
    path = tmp_path / "list.json"
    path.write_text("[1, 2]")
    with pytest.raises(DataFormatError, match="record 0: expected an object"):
        load_qa(path)
